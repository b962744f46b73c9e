//! The harness of the matrix: a program started as a tree stasis can dump
//! (stdin from /dev/null, stdout and stderr to a file, only fds 0-2), its
//! checkpoint in one of the three modes, its restore, and client load run
//! on threads.

pub use crate::common::programs_dir;
use crate::common::*;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How a program is checkpointed and restored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `dump` (the tree is killed), `restore`.
    Plain,
    /// `dump --leave-running --concurrent`, then kill, `restore`.
    Concurrent,
    /// `dump`, `restore --lazy`.
    Lazy,
}

/// How long anything may take on a machine whose cores are busy.
pub const PATIENCE: Duration = Duration::from_secs(120);

/// A loopback port that is free now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind 127.0.0.1:0")
        .local_addr()
        .expect("local_addr")
        .port()
}

/// What `stasis dump --json` said.
#[derive(Debug, Clone)]
pub struct DumpFigures {
    pub frozen_us: u64,
    pub total_us: u64,
    pub bytes: u64,
    pub processes: u64,
    pub threads: u64,
}

/// Reaps the connection holders a restore ended (`stasis-tcphold`, left
/// by a dump that killed its tree, reparented to this subreaper): only
/// those, whose comm says so, since other tests wait for their own
/// children.
fn reap_holders() {
    for c in my_children() {
        if comm_of(c) == "stasis-tcphold" {
            reap_if_ours_when_dead(c);
        }
    }
}

/// Reaps `pid` if it is a zombie now (a holder ended by the restore).
fn reap_if_ours_when_dead(pid: i32) {
    if !alive(pid) {
        reap_if_ours(pid);
    }
}

/// A real program under test, in its own directory: `out.log` (its stdout
/// and stderr), `images`, and whatever the scenario puts there.
pub struct Prog {
    pub name: String,
    pub dir: tempfile::TempDir,
    pub pid: i32,
    child: Option<Child>,
    /// The lazy filler's statistics file, after a lazy restore.
    lazy_stats: Option<PathBuf>,
    /// More arguments for `stasis dump`.
    pub dump_args: Vec<String>,
}

impl Prog {
    /// A fresh directory for program `name` (before it is started: a
    /// scenario writes its configuration and data there first).
    pub fn dir(name: &str) -> tempfile::TempDir {
        tempfile::Builder::new()
            .prefix(&format!("stasis-real-{name}-"))
            .tempdir()
            .expect("tempdir")
    }

    /// Starts `cmd` in `dir` with stdin from /dev/null and its output to
    /// `dir/out.log`.
    pub fn start(name: &str, dir: tempfile::TempDir, mut cmd: Command) -> Prog {
        become_subreaper();
        let out = std::fs::File::create(dir.path().join("out.log")).expect("out.log");
        cmd.current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("dup"))
            .stderr(out);
        close_inherited_fds(&mut cmd);
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name} ({cmd:?}): {e} (run scripts/setup.sh)"));
        let pid = i32::try_from(child.id()).expect("pid");
        Prog {
            name: name.into(),
            dir,
            pid,
            child: Some(child),
            lazy_stats: None,
            dump_args: Vec::new(),
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn out(&self) -> String {
        std::fs::read_to_string(self.path("out.log")).unwrap_or_default()
    }

    /// The last lines of the output, for failure messages.
    pub fn tail(&self) -> String {
        let out = self.out();
        let lines: Vec<&str> = out.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// Waits until `cond()` holds; fails early, with the program's output,
    /// if the program died.
    pub fn wait(&self, what: &str, mut cond: impl FnMut() -> bool) {
        let t0 = Instant::now();
        while !cond() {
            assert!(
                alive(self.pid),
                "{}: died while waiting for {what}:\n{}",
                self.name,
                self.tail()
            );
            assert!(
                t0.elapsed() < PATIENCE,
                "{}: {what}: not after {PATIENCE:?}:\n{}",
                self.name,
                self.tail()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits until the program accepts connections on 127.0.0.1:`port`.
    pub fn wait_port(&self, port: u16) {
        self.wait(&format!("listening on port {port}"), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
    }

    /// Waits until the program wrote its pid to `file` (it is ready).
    pub fn wait_pidfile(&self, file: &Path) {
        self.wait(&format!("pidfile {}", file.display()), || {
            std::fs::read_to_string(file)
                .ok()
                .and_then(|s| s.trim().parse::<i32>().ok())
                .is_some()
        });
    }

    /// Checkpoints the program in `mode`. Plain and lazy: the tree is
    /// killed, and reaped here. Concurrent: it runs on.
    pub fn checkpoint(&mut self, mode: Mode) -> DumpFigures {
        let tree = descendants(self.pid);
        let mut c = stasis();
        c.args(["dump", "--json", "-t", &self.pid.to_string(), "-D"])
            .arg(self.path("images"));
        if mode == Mode::Concurrent {
            c.args(["--leave-running", "--concurrent"]);
        }
        c.args(&self.dump_args);
        let o = c.output().expect("running stasis dump");
        assert_ok(&o, &format!("{mode:?} dump of {}", self.name));
        let v = json(&o);
        let n = |k: &str| {
            v[k].as_u64()
                .unwrap_or_else(|| panic!("dump --json: {k}: {v}"))
        };
        let f = DumpFigures {
            frozen_us: n("frozen_us"),
            total_us: n("total_us"),
            bytes: n("bytes"),
            processes: n("processes"),
            threads: n("threads"),
        };
        eprintln!("{} {mode:?}: dump {f:?}", self.name);
        if mode == Mode::Concurrent {
            assert!(alive(self.pid), "{}: died in a concurrent dump", self.name);
        } else {
            self.reap_tree(tree, libc::SIGKILL);
        }
        f
    }

    /// SIGKILLs the tree (after a concurrent dump) and reaps it.
    pub fn kill(&mut self) {
        let tree = descendants(self.pid);
        for &p in std::iter::once(&self.pid).chain(&tree) {
            // SAFETY: killing the program we started.
            unsafe { libc::kill(p, libc::SIGKILL) };
        }
        self.reap_tree(tree, libc::SIGKILL);
    }

    /// Reaps the root, which must die of `sig`, and `tree` (the processes
    /// under it before the dump): each must be gone. One that ended on its
    /// own just before the dump (a PostgreSQL backend whose client left)
    /// may have been reaped by its parent already, or exit 0.
    fn reap_tree(&mut self, tree: Vec<i32>, sig: i32) {
        assert_eq!(
            self.reap(),
            (None, Some(sig)),
            "{}: the root should die of signal {sig}",
            self.name
        );
        for k in tree {
            reap_if_ours(k);
            assert!(!alive(k), "{}: process {k} outlived the dump", self.name);
        }
    }

    /// Waits for the root (our child, or an orphan reparented to us).
    pub fn reap(&mut self) -> (Option<i32>, Option<i32>) {
        if let Some(mut c) = self.child.take() {
            use std::os::unix::process::ExitStatusExt;
            let st = c.wait().expect("wait");
            return (st.code(), st.signal());
        }
        waitpid_timeout(self.pid, PATIENCE)
    }

    /// `stasis restore --detach` (with `--lazy` in lazy mode).
    pub fn restore(&mut self, mode: Mode) {
        let mut c = stasis();
        c.args(["restore", "--detach", "-D"])
            .arg(self.path("images"));
        if mode == Mode::Lazy {
            let stats = self.path("lazy-stats.json");
            // Streaming capped, so that the program meets pages that have
            // not arrived yet (an image of 10-40 MiB takes 1-3 s).
            c.args(["--lazy", "--lazy-bandwidth", "16M", "--lazy-stats"])
                .arg(&stats);
            self.lazy_stats = Some(stats);
        }
        let t0 = Instant::now();
        let o = c.output().expect("running stasis restore");
        assert_ok(&o, &format!("{mode:?} restore of {}", self.name));
        reap_holders();
        eprintln!("{} {mode:?}: restore took {:?}", self.name, t0.elapsed());
        assert!(
            alive(self.pid),
            "{}: restored process {} is not running:\n{}",
            self.name,
            self.pid,
            self.tail()
        );
    }

    /// After a lazy restore: waits for the filler to finish, checks it
    /// reported no error, and returns its statistics.
    pub fn lazy_done(&mut self) -> Option<serde_json::Value> {
        let stats = self.lazy_stats.take()?;
        let s = wait_json_file(&stats, PATIENCE);
        assert!(s.get("error").is_none(), "{}: lazy fill: {s}", self.name);
        eprintln!("{}: lazy fill {s}", self.name);
        Some(s)
    }

    /// Sends `sig` to the root and waits for it to exit with `code`.
    pub fn stop(&mut self, sig: i32, code: i32) {
        // SAFETY: signalling the program we started.
        unsafe { libc::kill(self.pid, sig) };
        let st = self.reap();
        assert_eq!(
            st,
            (Some(code), None),
            "{}: after signal {sig}:\n{}",
            self.name,
            self.tail()
        );
    }
}

impl Drop for Prog {
    fn drop(&mut self) {
        // After a failed test: kill the whole tree, reap what is ours.
        let mut all = descendants(self.pid);
        all.insert(0, self.pid);
        for &p in &all {
            if alive(p) {
                // SAFETY: killing the program's own processes.
                unsafe { libc::kill(p, libc::SIGKILL) };
            }
        }
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        for p in all {
            reap_if_ours(p);
        }
        // A lazy filler still streaming exits once its process is gone.
        if let Some(stats) = self.lazy_stats.take() {
            let t0 = Instant::now();
            while !stats.exists() && t0.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// Client threads that keep a program busy: each runs `step(client, i)`
/// for i = 0, 1, ... (1 ms apart) until stopped, counting what was acknowledged; the
/// first error of any of them is kept.
pub struct Load {
    stop: Arc<AtomicBool>,
    pub done: Vec<Arc<AtomicU64>>,
    error: Arc<Mutex<Option<String>>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

/// The pause of a load client between two steps.
const PACE: Duration = Duration::from_millis(1);

/// One client of a `Load`: called with the step number, returns an error
/// message on a wrong answer.
pub type Step = Box<dyn FnMut(u64) -> Result<(), String> + Send>;

impl Load {
    pub fn start(clients: Vec<Step>) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let error = Arc::new(Mutex::new(None));
        let mut done = Vec::new();
        let mut threads = Vec::new();
        for (c, mut step) in clients.into_iter().enumerate() {
            let (stop, error) = (stop.clone(), error.clone());
            let n = Arc::new(AtomicU64::new(0));
            done.push(n.clone());
            threads.push(std::thread::spawn(move || {
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    if let Err(e) = step(i) {
                        error
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .get_or_insert(format!("client {c}, step {i}: {e}"));
                        return;
                    }
                    i += 1;
                    n.store(i, Ordering::Release);
                    // A steady load, not a flood: what the clients wrote
                    // stays small enough to read back whole.
                    std::thread::sleep(PACE);
                }
            }));
        }
        Load {
            stop,
            done,
            error,
            threads,
        }
    }

    /// Steps acknowledged so far, per client.
    pub fn counts(&self) -> Vec<u64> {
        self.done
            .iter()
            .map(|n| n.load(Ordering::Acquire))
            .collect()
    }

    pub fn check(&self) {
        let e = self.error.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(e) = e {
            panic!("load: {e}");
        }
    }

    /// Waits until every client did at least `n` more steps than `base`.
    pub fn wait_beyond(&self, prog: &Prog, base: &[u64], n: u64, what: &str) {
        prog.wait(what, || {
            self.check();
            self.counts().iter().zip(base).all(|(c, b)| *c >= b + n)
        });
    }

    /// Stops the clients; returns what each had acknowledged.
    pub fn finish(mut self) -> Vec<u64> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            t.join().expect("load thread");
        }
        self.check();
        self.counts()
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// A deterministic value of `len` bytes for `seed` (text, no spaces).
pub fn value(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut v = format!("{seed}:").into_bytes();
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.push(b'a' + u8::try_from(x % 26).expect("< 26"));
    }
    v.truncate(len);
    v
}

/// SHA-256 in hex, of `data`.
pub fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
