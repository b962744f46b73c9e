//! Shared harness of the end-to-end tests: builds the C workloads, starts
//! them in the zdtm protocol (pidfile when ready, PASS/FAIL after SIGTERM),
//! and drives the real `stasis` binary against them. These tests need root
//! (ptrace, clone3 set_tid); CI runs them as root.

#![allow(dead_code)]

pub mod cluster;
pub mod net;
pub mod resp;
pub mod s3;

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The stasis binary under test.
pub fn stasis() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_stasis"));
    close_inherited_fds(&mut c);
    c
}

/// The stasis binary under test, run in network namespace `netns` (a
/// "host") if given (`ip netns exec`, which execs it).
pub fn stasis_in(netns: Option<&str>) -> Command {
    match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns])
                .arg(env!("CARGO_BIN_EXE_stasis"));
            close_inherited_fds(&mut c);
            c
        }
        None => stasis(),
    }
}

/// A network namespace of one test's own (`ip netns add`, loopback up),
/// deleted when dropped. A tree whose sockets are restored after the
/// original released their ports (`--leave-running`, or a dump that killed
/// it) runs in one, with its dumps and restores: there no other test's
/// process can take those ports meanwhile (a `connect` elsewhere on the
/// machine may be given the same ephemeral port).
pub struct NetNs {
    pub name: String,
}

impl NetNs {
    pub fn create(tag: &str) -> NetNs {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "stw-{}-{tag}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        for args in [
            &["netns", "add", &name][..],
            &["-n", &name, "link", "set", "lo", "up"][..],
        ] {
            let o = Command::new("ip").args(args).output().expect("running ip");
            assert_ok(&o, &format!("ip {}", args.join(" ")));
        }
        NetNs { name }
    }

    /// `program` run in this namespace by `nsenter --net` (which execs it,
    /// so the child is the program; unlike `ip netns exec` it keeps the
    /// mount namespace).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net=/run/netns/{}", self.name))
            .arg("--")
            .arg(program);
        close_inherited_fds(&mut c);
        c
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// Makes sure the spawned program gets only stdin/stdout/stderr (a test
/// runner may leak pipes, which a dump would rightly refuse).
pub fn close_inherited_fds(c: &mut Command) {
    // SAFETY: close_range is async-signal-safe and runs in the child between
    // fork and exec, touching only fds >= 3.
    unsafe {
        c.pre_exec(|| {
            libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32);
            Ok(())
        });
    }
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repo root")
}

/// The helper programs of the tests (`tests/programs/` in the repo).
pub fn programs_dir() -> PathBuf {
    repo_root().join("tests/programs")
}

/// Restored processes are orphans (`stasis restore --detach` exits): this
/// test process becomes their reaper, once.
pub fn become_subreaper() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: prctl with integer arguments.
        let r = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
        assert_eq!(r, 0, "PR_SET_CHILD_SUBREAPER");
    });
}

/// Builds the workloads once per test binary; returns the directory.
pub fn workloads() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        // Reparent orphaned restored processes to this test process, so
        // the tests can reap and check them.
        // SAFETY: prctl with integer arguments.
        unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
        let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("workloads");
        let st = Command::new("make")
            .arg("-s")
            .arg("-C")
            .arg(repo_root().join("tests/workloads"))
            .arg(format!("OUT={}", out.display()))
            .status()
            .expect("running make for the test workloads (is a C compiler installed? run scripts/setup.sh)");
        assert!(st.success(), "building the test workloads failed");
        out
    })
}

/// A workload process under test, in its own directory.
pub struct Workload {
    pub name: String,
    pub dir: tempfile::TempDir,
    pub pid: i32,
    /// Set while the workload is a direct child spawned by us.
    child: Option<std::process::Child>,
    /// The network namespace it runs in, with its dumps and restores.
    netns: Option<NetNs>,
}

impl Workload {
    /// Starts `name` with `args`; waits for its pidfile.
    pub fn start(name: &str, args: &[&str]) -> Workload {
        Workload::start_in(name, args, None)
    }

    /// [`Workload::start`] in a network namespace of its own, where its
    /// dumps and restores run too.
    pub fn start_isolated(name: &str, args: &[&str]) -> Workload {
        Workload::start_in(name, args, Some(NetNs::create(name)))
    }

    fn start_in(name: &str, args: &[&str], netns: Option<NetNs>) -> Workload {
        let bin = workloads().join(name);
        let dir = tempfile::Builder::new()
            .prefix(&format!("stasis-{name}-"))
            .tempdir()
            .expect("tempdir");
        std::fs::create_dir(dir.path().join("work")).expect("work dir");
        let out = std::fs::File::create(dir.path().join("out.log")).expect("out.log");
        let pidfile = dir.path().join("pid");
        let mut c = match &netns {
            Some(ns) => ns.command(&bin),
            None => Command::new(&bin),
        };
        c.arg(&pidfile)
            .args(args)
            .current_dir(dir.path().join("work"))
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("dup"))
            .stderr(out);
        close_inherited_fds(&mut c);
        let child = c
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
        let pid = wait_pidfile(&pidfile, Duration::from_secs(30));
        assert_eq!(pid, child.id() as i32, "pidfile of {name}");
        Workload {
            name: name.into(),
            dir,
            pid,
            child: Some(child),
            netns,
        }
    }

    /// The stasis binary, in the workload's network namespace if it has
    /// one.
    pub fn stasis(&self) -> Command {
        match &self.netns {
            Some(ns) => ns.command(env!("CARGO_BIN_EXE_stasis")),
            None => stasis(),
        }
    }

    pub fn images(&self) -> PathBuf {
        self.dir.path().join("images")
    }

    pub fn out(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("out.log")).unwrap_or_default()
    }

    /// `stasis dump` of the workload into its image dir.
    pub fn dump(&self, extra: &[&str]) -> Output {
        self.stasis()
            .args(["dump", "-t", &self.pid.to_string(), "-D"])
            .arg(self.images())
            .args(extra)
            .output()
            .expect("running stasis dump")
    }

    /// Dumps (killing it) and reaps the killed process.
    pub fn dump_and_reap(&mut self) {
        let tree = descendants(self.pid);
        let o = self.dump(&[]);
        assert_ok(&o, &format!("dump of {}", self.name));
        let (code, sig) = self.reap();
        assert_eq!(
            (code, sig),
            (None, Some(libc::SIGKILL)),
            "{}: dumped process should die of SIGKILL",
            self.name
        );
        // The tree's other processes were re-parented to this (subreaper)
        // test process when their parents died: reap them too, so their
        // PIDs are free for the restore.
        for pid in tree {
            reap_if_ours(pid);
        }
    }

    /// Waits for the workload (a child, or an orphan reparented to us).
    pub fn reap(&mut self) -> (Option<i32>, Option<i32>) {
        if let Some(mut c) = self.child.take() {
            let st = c.wait().expect("wait");
            use std::os::unix::process::ExitStatusExt;
            return (st.code(), st.signal());
        }
        waitpid_timeout(self.pid, Duration::from_secs(60))
    }

    /// `stasis restore --detach` at the saved PID.
    pub fn restore(&mut self, extra: &[&str]) {
        let o = self
            .stasis()
            .args(["restore", "--detach", "-D"])
            .arg(self.images())
            .args(extra)
            .output()
            .expect("running stasis restore");
        assert_ok(&o, &format!("restore of {}", self.name));
        assert!(
            alive(self.pid),
            "{}: restored process {} is not running",
            self.name,
            self.pid
        );
    }

    /// SIGTERM, wait, and require exit 0 with a final `PASS` line.
    pub fn finish_pass(&mut self) {
        // SAFETY: signalling our workload.
        unsafe { libc::kill(self.pid, libc::SIGTERM) };
        let (code, sig) = self.reap();
        let out = self.out();
        assert_eq!(
            (code, sig),
            (Some(0), None),
            "{} did not exit 0; output:\n{out}",
            self.name
        );
        let last = out.lines().last().unwrap_or("");
        assert_eq!(last, "PASS", "{}: output:\n{out}", self.name);
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        for pid in descendants(self.pid) {
            // SAFETY: cleaning up the workload's own processes after a failed test.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        if alive(self.pid) {
            // SAFETY: cleaning up our own workload after a failed test.
            unsafe { libc::kill(self.pid, libc::SIGKILL) };
            let _ = self.reap();
        }
    }
}

/// The JSON object on the last line of a command's stdout.
pub fn json(o: &Output) -> serde_json::Value {
    let text = String::from_utf8_lossy(&o.stdout);
    serde_json::from_str(text.lines().last().unwrap_or(""))
        .unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// SIGKILLs the workload and its descendants, and reaps them.
pub fn kill_and_reap(w: &mut Workload) {
    let tree = descendants(w.pid);
    for pid in std::iter::once(w.pid).chain(tree.iter().copied()) {
        // SAFETY: killing our own workload's processes.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    let _ = w.reap();
    for pid in tree {
        reap_if_ours(pid);
    }
}

pub fn assert_ok(o: &Output, what: &str) {
    assert!(
        o.status.success(),
        "{what} failed ({}):\nstdout: {}\nstderr: {}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Asserts a clean failure: non-zero exit 1, an error line containing
/// `needle`, no panic.
pub fn assert_fails_with(o: &Output, needle: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "expected exit 1; stderr: {err}");
    assert!(
        err.contains(needle),
        "stderr should mention {needle:?}: {err}"
    );
    assert!(!err.contains("panicked"), "panic: {err}");
}

pub fn wait_pidfile(path: &Path, timeout: Duration) -> i32 {
    let t0 = Instant::now();
    loop {
        if let Some(p) = std::fs::read_to_string(path)
            .ok()
            .and_then(|s| s.trim().parse().ok())
        {
            return p;
        }
        assert!(
            t0.elapsed() < timeout,
            "no pidfile {} after {timeout:?}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// True if `pid` exists and is not a zombie.
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !matches!(
            s.rfind(')')
                .and_then(|i| s[i + 1..].split_whitespace().next()),
            Some("Z") | Some("X")
        ),
        Err(_) => false,
    }
}

/// waitpid with a timeout (polling WNOHANG); returns (exit code, signal).
pub fn waitpid_timeout(pid: i32, timeout: Duration) -> (Option<i32>, Option<i32>) {
    let t0 = Instant::now();
    loop {
        let mut st = 0;
        // SAFETY: waitpid with a valid out-pointer.
        let r = unsafe { libc::waitpid(pid, &mut st, libc::WNOHANG) };
        if r == pid {
            if libc::WIFEXITED(st) {
                return (Some(libc::WEXITSTATUS(st)), None);
            }
            if libc::WIFSIGNALED(st) {
                return (None, Some(libc::WTERMSIG(st)));
            }
        }
        if r < 0 {
            panic!(
                "waitpid({pid}): {} (not our child?)",
                std::io::Error::last_os_error()
            );
        }
        assert!(
            t0.elapsed() < timeout,
            "process {pid} did not exit within {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Every descendant of `pid` (children of all its threads, recursively).
pub fn descendants(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    let mut queue = vec![pid];
    while let Some(p) = queue.pop() {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) else {
            continue;
        };
        for t in tasks.flatten() {
            if let Ok(c) = std::fs::read_to_string(t.path().join("children")) {
                for k in c.split_whitespace().filter_map(|x| x.parse::<i32>().ok()) {
                    out.push(k);
                    queue.push(k);
                }
            }
        }
    }
    out
}

/// Kills a process when a test ends, also when it fails midway (a
/// workload left running would load the machine for the rest of the run).
pub struct KillOnDrop(pub i32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if alive(self.0) {
            // SAFETY: killing a process the test started (or restored).
            unsafe { libc::kill(self.0, libc::SIGKILL) };
            reap_if_ours(self.0);
        }
    }
}

/// Reaps `pid` if it is (or becomes within 5 s) a zombie child of this
/// process; does nothing if it is not our child.
pub fn reap_if_ours(pid: i32) {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(5) {
        let mut st = 0;
        // SAFETY: waitpid with a valid out-pointer.
        let r = unsafe { libc::waitpid(pid, &mut st, libc::WNOHANG) };
        if r == pid || r < 0 {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A PID that is not in use right now.
pub fn unused_pid() -> i32 {
    let max: i32 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(32768);
    (1000..max)
        .rev()
        .find(|p| !Path::new(&format!("/proc/{p}")).exists())
        .expect("a free pid")
}

/// Waits for `path` to hold a JSON object (written by another process).
pub fn wait_json_file(path: &Path, timeout: Duration) -> serde_json::Value {
    let t0 = std::time::Instant::now();
    loop {
        if let Ok(text) = std::fs::read_to_string(path) {
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) {
                return v;
            }
        }
        assert!(
            t0.elapsed() < timeout,
            "{} did not appear in {timeout:?}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `stasis page-server` serving `dir` on a free loopback port.
pub struct PageServer {
    child: std::process::Child,
    pub addr: String,
    pub token_file: PathBuf,
    /// Its stderr (warnings, refusals), for failure messages.
    pub log: PathBuf,
}

impl PageServer {
    /// Starts a page server for `dir` with token `token` (kept in a 0600
    /// file next to `dir`), listening on `listen` (port 0: any).
    pub fn start_on(dir: &Path, token: &str, listen: &str, netns: Option<&str>) -> PageServer {
        use std::io::BufRead;
        use std::os::unix::fs::PermissionsExt;
        let token_file = dir.with_extension(format!("token-{}", std::process::id()));
        let log = dir.with_extension(format!("page-server-{}.log", std::process::id()));
        std::fs::write(&token_file, token).unwrap();
        std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let mut c = stasis_in(netns);
        c.args(["page-server", "--json", "--listen", listen, "--token-file"])
            .arg(&token_file)
            .arg("-D")
            .arg(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            // Each connection's end, not only warnings.
            .env("STASIS_LOG", "info")
            .stderr(std::fs::File::create(&log).expect("page server log"));
        let mut child = c.spawn().expect("starting the page server");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let v: serde_json::Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("page server said {line:?}: {e}"));
        PageServer {
            child,
            addr: v["listening"].as_str().unwrap().to_string(),
            token_file,
            log,
        }
    }

    pub fn start(dir: &Path, token: &str) -> PageServer {
        Self::start_on(dir, token, "127.0.0.1:0", None)
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its pid and `/proc` state letter (`S` waiting, `T` stopped, `Z`
    /// dead), for failure messages.
    pub fn describe(&self) -> String {
        let pid = self.child.id();
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                s.rsplit(')')
                    .next()?
                    .split_whitespace()
                    .next()
                    .map(str::to_string)
            })
            .unwrap_or_else(|| "gone".into());
        format!("pid {pid}, state {state}")
    }

    /// What the server logged so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for PageServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_file(&self.token_file);
    }
}

/// A TCP relay in front of a server: optionally slowed to `rate` bytes per
/// second per connection, and optionally cutting each connection once it
/// has sent `cut_after` bytes back to the client (mid-page, say).
pub struct Proxy {
    pub addr: String,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Connections that were cut.
    pub cuts: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl Proxy {
    pub fn start(upstream: &str, rate: Option<u64>, cut_after: Option<u64>) -> Proxy {
        use std::io::{Read, Write};
        use std::net::{Shutdown, TcpListener, TcpStream};
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        use std::sync::Arc;
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let stop = Arc::new(AtomicBool::new(false));
        let cuts = Arc::new(AtomicU64::new(0));
        let (st, cu, up) = (stop.clone(), cuts.clone(), upstream.to_string());
        std::thread::spawn(move || {
            while !st.load(Ordering::Relaxed) {
                let Ok((client, _)) = l.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                client.set_nonblocking(false).unwrap();
                let Ok(server) = TcpStream::connect(&up) else {
                    continue;
                };
                let (mut c1, mut s1) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                std::thread::spawn(move || {
                    let mut buf = [0u8; 16384];
                    while let Ok(n) = c1.read(&mut buf) {
                        if n == 0 || s1.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = s1.shutdown(Shutdown::Write);
                });
                let (mut s2, mut c2, cu2, st2) = (server, client, cu.clone(), st.clone());
                std::thread::spawn(move || {
                    let mut buf = [0u8; 16384];
                    let mut sent = 0u64;
                    let t0 = std::time::Instant::now();
                    while let Ok(n) = s2.read(&mut buf) {
                        if n == 0 || st2.load(Ordering::Relaxed) {
                            break;
                        }
                        if let Some(cut) = cut_after {
                            if sent + n as u64 >= cut {
                                let keep = usize::try_from(cut - sent).unwrap_or(n);
                                let _ = c2.write_all(&buf[..keep]);
                                cu2.fetch_add(1, Ordering::Relaxed);
                                break;
                            }
                        }
                        if c2.write_all(&buf[..n]).is_err() {
                            break;
                        }
                        sent += n as u64;
                        if let Some(r) = rate {
                            let due = Duration::from_secs_f64(sent as f64 / r as f64);
                            if let Some(w) = due.checked_sub(t0.elapsed()) {
                                std::thread::sleep(w);
                            }
                        }
                    }
                    let _ = c2.shutdown(Shutdown::Both);
                    let _ = s2.shutdown(Shutdown::Both);
                });
            }
        });
        Proxy { addr, stop, cuts }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Pages of `[base, base + npages pages)` stored in checkpoint `n`'s own
/// pack (first process), as page indexes from `base`.
pub fn pages_in_pack(
    images: &Path,
    n: u32,
    base: u64,
    npages: u64,
) -> std::collections::BTreeSet<u64> {
    let store = stasis_image::ImageDir::open(images).unwrap();
    let cp = store.load(Some(n)).unwrap();
    let p = &cp.manifest.processes[0];
    let pack = cp.open_process_pack(p).unwrap().expect("a pack");
    let mut out = std::collections::BTreeSet::new();
    for r in pack.runs() {
        for i in 0..u64::from(r.npages) {
            let a = r.vaddr + i * 4096;
            if a >= base && a < base + npages * 4096 {
                out.insert((a - base) / 4096);
            }
        }
    }
    out
}

/// Waits until `cond()` holds, polling every 10 ms; panics, saying `what`
/// it waited for, after `timeout`. Tests wait for conditions this way
/// (never a fixed sleep followed by a count): the suite must pass on a
/// machine whose cores are all busy.
pub fn wait_until(timeout: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(t0.elapsed() < timeout, "{what}: not after {timeout:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The lines a child writes to a pipe (`stasis run --json`'s events, say),
/// read on a thread so that a test can wait for one with a deadline.
pub struct Lines {
    rx: std::sync::mpsc::Receiver<String>,
    /// Every line received so far, for failure messages.
    pub seen: Vec<String>,
}

impl Lines {
    pub fn new(r: impl std::io::Read + Send + 'static) -> Lines {
        use std::io::BufRead;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for l in std::io::BufReader::new(r).lines() {
                let Ok(l) = l else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Lines {
            rx,
            seen: Vec::new(),
        }
    }

    /// The next line, or `None` once the writer closed the pipe; panics
    /// after `timeout`.
    pub fn next(&mut self, timeout: Duration) -> Option<String> {
        use std::sync::mpsc::RecvTimeoutError;
        match self.rx.recv_timeout(timeout) {
            Ok(l) => {
                self.seen.push(l.clone());
                Some(l)
            }
            Err(RecvTimeoutError::Disconnected) => None,
            Err(RecvTimeoutError::Timeout) => {
                panic!("no line in {timeout:?}; so far:\n{}", self.seen.join("\n"))
            }
        }
    }

    /// Waits (up to `timeout` in all) for the next line that `pred`
    /// accepts; panics if none comes.
    pub fn wait_for(&mut self, timeout: Duration, mut pred: impl FnMut(&str) -> bool) -> String {
        let t0 = Instant::now();
        loop {
            let left = timeout.saturating_sub(t0.elapsed());
            match self.next(left) {
                Some(l) if pred(&l) => return l,
                Some(_) => {}
                None => panic!(
                    "the output ended before the line waited for:\n{}",
                    self.seen.join("\n")
                ),
            }
        }
    }

    /// Waits for the next JSON line whose `event` is `event`.
    pub fn wait_event(&mut self, timeout: Duration, event: &str) -> serde_json::Value {
        let l = self.wait_for(timeout, |l| {
            serde_json::from_str::<serde_json::Value>(l).is_ok_and(|v| v["event"] == event)
        });
        serde_json::from_str(&l).unwrap()
    }

    /// Every remaining line, until the writer closes the pipe (panics
    /// after `timeout`); returns all the lines seen, these included.
    pub fn rest(&mut self, timeout: Duration) -> String {
        let t0 = Instant::now();
        while self.next(timeout.saturating_sub(t0.elapsed())).is_some() {}
        self.seen.join("\n")
    }
}

/// splitmix64: small, seedable, reproducible (the random campaigns).
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (0 if `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
}

/// Every task (thread) of `pid`, the process itself first.
pub fn tasks_of(pid: i32) -> Vec<i32> {
    let mut v = vec![pid];
    if let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        v.extend(
            rd.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
                .filter(|&t| t != pid),
        );
    }
    v
}

/// Every PID and TID of the tree under `pid`.
pub fn tree_tids(pid: i32) -> Vec<i32> {
    std::iter::once(pid)
        .chain(descendants(pid))
        .flat_map(tasks_of)
        .collect()
}

/// `/proc/PID/comm`, or empty.
pub fn comm_of(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// `/proc/PID/cmdline` with spaces for NULs, or empty.
pub fn cmdline_of(pid: i32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

/// Every file under `root` (recursively), by path relative to it.
pub fn files_under(root: &Path) -> std::collections::BTreeMap<PathBuf, Vec<u8>> {
    let mut out = std::collections::BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                stack.push(p);
            } else if let Ok(b) = std::fs::read(&p) {
                out.insert(p.strip_prefix(root).unwrap().to_path_buf(), b);
            }
        }
    }
    out
}

/// Every child of this process (of any of its threads).
pub fn my_children() -> Vec<i32> {
    let me = std::process::id() as i32;
    tasks_of(me)
        .into_iter()
        .flat_map(|t| {
            std::fs::read_to_string(format!("/proc/{me}/task/{t}/children"))
                .unwrap_or_default()
                .split_whitespace()
                .filter_map(|x| x.parse::<i32>().ok())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Reaps this process's zombie children and waits (up to `wait`) for the
/// others to end; returns those still alive then, with their command lines.
pub fn reap_children(wait: Duration) -> Vec<(i32, String)> {
    let t0 = Instant::now();
    loop {
        let mut alive = Vec::new();
        for c in my_children() {
            let mut st = 0;
            // SAFETY: waitpid with a valid out-pointer on our own child.
            let r = unsafe { libc::waitpid(c, &mut st, libc::WNOHANG) };
            if r == 0 {
                alive.push((c, cmdline_of(c)));
            }
        }
        if alive.is_empty() || t0.elapsed() >= wait {
            return alive;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Runs `cmd` with its output (stdout and stderr) captured, killing it
/// after `limit`. Returns (exit code, output, elapsed, hung).
pub fn run_bounded(mut cmd: Command, limit: Duration) -> (Option<i32>, String, Duration, bool) {
    let err_file = tempfile::NamedTempFile::new().unwrap();
    cmd.stdin(Stdio::null())
        .stdout(err_file.reopen().unwrap())
        .stderr(err_file.reopen().unwrap());
    let t0 = Instant::now();
    let mut child = cmd.spawn().expect("spawning stasis");
    let (code, hung) = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break (st.code(), false);
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break (None, true);
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let elapsed = t0.elapsed();
    let err = std::fs::read_to_string(err_file.path()).unwrap_or_default();
    (code, err, elapsed, hung)
}

/// 32-byte samples of the process's memory: the start of 64 pages spread
/// over its largest private writable mapping (read through /proc/PID/mem),
/// all distinct and not all zero.
pub fn memory_samples(pid: i32) -> std::collections::HashSet<[u8; 32]> {
    use std::os::unix::fs::FileExt;
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let (start, end) = maps
        .lines()
        .filter(|l| l.split_whitespace().nth(1) == Some("rw-p"))
        .filter_map(|l| {
            let (a, b) = l.split_whitespace().next()?.split_once('-')?;
            Some((
                u64::from_str_radix(a, 16).ok()?,
                u64::from_str_radix(b, 16).ok()?,
            ))
        })
        .max_by_key(|(a, b)| b - a)
        .unwrap();
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    let pages = (end - start) / 4096;
    let mut out = std::collections::HashSet::new();
    for i in 0..64 {
        let mut b = [0u8; 32];
        mem.read_exact_at(&mut b, start + (i * pages / 64) * 4096)
            .unwrap();
        if b != [0; 32] {
            out.insert(b);
        }
    }
    assert!(out.len() >= 32, "too few distinct samples: {}", out.len());
    out
}

/// The JSON objects a child prints on stdout, one a line, as they come (a
/// line that is not JSON comes as `{"line": ...}`).
pub fn json_events(
    child: &mut std::process::Child,
) -> std::sync::mpsc::Receiver<serde_json::Value> {
    use std::io::BufRead;
    let (tx, rx) = std::sync::mpsc::channel::<serde_json::Value>();
    let out = child.stdout.take().expect("a piped stdout");
    std::thread::spawn(move || {
        for l in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(serde_json::from_str(&l).unwrap_or(serde_json::json!({"line": l})));
        }
    });
    rx
}
