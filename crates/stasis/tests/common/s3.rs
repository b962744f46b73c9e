//! A real S3-compatible server for the object-store tests: versitygw
//! (installed by scripts/setup.sh through scripts/versitygw.sh) on a free
//! loopback port over a temporary directory, killed when dropped. Its
//! backing directory holds one sub-directory per bucket, so a test can
//! look at (and damage) exactly what the store holds.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{assert_ok, stasis, KillOnDrop, Workload};

pub const ACCESS_KEY: &str = "stasis-test";
pub const SECRET_KEY: &str = "stasis-test-secret";
pub const BUCKET: &str = "ckpts";

/// The versitygw binary (panics with what to run if it is missing).
pub fn versitygw() -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/versitygw.sh");
    let o = Command::new("bash")
        .arg(&script)
        .arg("path")
        .output()
        .expect("running versitygw.sh");
    assert!(
        o.status.success(),
        "versitygw is not installed: run scripts/setup.sh (or scripts/versitygw.sh install)"
    );
    PathBuf::from(String::from_utf8_lossy(&o.stdout).trim())
}

/// A free loopback port (bound then released).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A versitygw server with one bucket, `BUCKET`.
pub struct S3Server {
    /// The backing directory (`root/BUCKET/...` are the objects).
    pub root: tempfile::TempDir,
    /// Staging directories of the dumps run through [`S3Server::stasis`].
    pub staging: tempfile::TempDir,
    pub port: u16,
    /// Where clients connect (the server, or a relay in front of it).
    pub endpoint: String,
    proc: Option<(std::process::Child, KillOnDrop)>,
    /// The network namespace and address it listens in (`None`: the
    /// root namespace's loopback).
    netns: Option<(String, String)>,
}

impl S3Server {
    pub fn start() -> S3Server {
        let root = tempfile::Builder::new()
            .prefix("stasis-s3-root-")
            .tempdir()
            .unwrap();
        std::fs::create_dir(root.path().join(BUCKET)).unwrap();
        let staging = tempfile::Builder::new()
            .prefix("stasis-s3-staging-")
            .tempdir()
            .unwrap();
        let port = free_port();
        let mut s = S3Server {
            root,
            staging,
            port,
            endpoint: format!("http://127.0.0.1:{port}"),
            proc: None,
            netns: None,
        };
        s.restart();
        s
    }

    /// A server in network namespace `netns`, listening on `addr:port`
    /// (an address of that namespace): for clients in other namespaces
    /// that reach it (hosts on a bridge), to which the root namespace's
    /// loopback is out of reach. The test itself sees the store through
    /// [`bucket_dir`](Self::bucket_dir).
    pub fn start_in(netns: &str, addr: &str, port: u16) -> S3Server {
        let mut s = S3Server::start_stopped();
        s.port = port;
        s.endpoint = format!("http://{addr}:{port}");
        s.netns = Some((netns.to_string(), addr.to_string()));
        s.restart();
        s
    }

    fn start_stopped() -> S3Server {
        let root = tempfile::Builder::new()
            .prefix("stasis-s3-root-")
            .tempdir()
            .unwrap();
        std::fs::create_dir(root.path().join(BUCKET)).unwrap();
        let staging = tempfile::Builder::new()
            .prefix("stasis-s3-staging-")
            .tempdir()
            .unwrap();
        S3Server {
            root,
            staging,
            port: 0,
            endpoint: String::new(),
            proc: None,
            netns: None,
        }
    }

    /// The environment of a client of this server (staging under
    /// `staging`).
    pub fn env(&self, staging: &Path) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT_URL", self.endpoint.clone()),
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY.into()),
            ("AWS_SECRET_ACCESS_KEY", SECRET_KEY.into()),
            ("AWS_REGION", "us-east-1".into()),
            ("AWS_ALLOW_HTTP", "true".into()),
            ("STASIS_S3_STAGING", staging.display().to_string()),
        ]
    }

    /// Starts the server (again) on its port over its directory; returns
    /// once it accepts connections.
    pub fn restart(&mut self) {
        assert!(self.proc.is_none(), "server already running");
        let log = std::fs::File::create(self.staging.path().join("versitygw.log")).unwrap();
        let (mut cmd, host) = match &self.netns {
            // `ip netns exec` execs: the child is the server.
            Some((ns, addr)) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(versitygw());
                (c, addr.clone())
            }
            None => (Command::new(versitygw()), "127.0.0.1".to_string()),
        };
        let child = cmd
            .args(["--port", &format!("{host}:{}", self.port), "posix"])
            .arg(self.root.path())
            .env("ROOT_ACCESS_KEY", ACCESS_KEY)
            .env("ROOT_SECRET_KEY", SECRET_KEY)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("starting versitygw");
        let guard = KillOnDrop(child.id() as i32);
        let t0 = Instant::now();
        let up = || match &self.netns {
            Some((ns, addr)) => Command::new("ip")
                .args(["netns", "exec", ns, "bash", "-c"])
                .arg(format!("exec 3<>/dev/tcp/{addr}/{}", self.port))
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success()),
            None => TcpStream::connect(("127.0.0.1", self.port)).is_ok(),
        };
        while !up() {
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "versitygw did not start"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        self.proc = Some((child, guard));
    }

    /// SIGKILLs the server and reaps it.
    pub fn kill(&mut self) {
        if let Some((mut child, _guard)) = self.proc.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The bucket's backing directory.
    pub fn bucket_dir(&self) -> PathBuf {
        self.root.path().join(BUCKET)
    }

    /// `s3://BUCKET/PREFIX`.
    pub fn url(&self, prefix: &str) -> String {
        format!("s3://{BUCKET}/{prefix}")
    }

    /// The stasis binary configured for this server.
    pub fn stasis(&self) -> Command {
        let mut c = stasis();
        c.env("AWS_ENDPOINT_URL", &self.endpoint)
            .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
            .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
            .env("AWS_REGION", "us-east-1")
            .env("AWS_ALLOW_HTTP", "true")
            .env("STASIS_S3_STAGING", self.staging.path());
        c
    }

    /// `stasis dump -t PID -D URL EXTRA...`.
    pub fn dump(&self, w: &Workload, url: &str, extra: &[&str]) -> Output {
        self.stasis()
            .args(["dump", "-t", &w.pid.to_string(), "-D", url])
            .args(extra)
            .output()
            .unwrap()
    }

    /// `stasis restore --detach -D URL EXTRA...`.
    pub fn restore(&self, url: &str, extra: &[&str]) -> Output {
        self.stasis()
            .args(["restore", "--detach", "-D", url])
            .args(extra)
            .output()
            .unwrap()
    }

    /// Every file under the backing directory, with its content.
    pub fn stored_files(&self) -> Vec<(PathBuf, Vec<u8>)> {
        super::files_under(self.root.path()).into_iter().collect()
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A relay to `upstream` that passes client-to-server bytes at `rate`
/// bytes per second (an upload that takes a while); stopped when dropped.
pub struct SlowUpload {
    pub endpoint: String,
    stop: Arc<AtomicBool>,
}

impl SlowUpload {
    pub fn start(upstream: u16, rate: u64) -> SlowUpload {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let endpoint = format!("http://{}", l.local_addr().unwrap());
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        std::thread::spawn(move || {
            while !st.load(Ordering::Relaxed) {
                let Ok((client, _)) = l.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                client.set_nonblocking(false).unwrap();
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    continue;
                };
                let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                let st2 = st.clone();
                std::thread::spawn(move || pump(client, server, Some(rate), st2));
                let st3 = st.clone();
                std::thread::spawn(move || pump(s2, c2, None, st3));
            }
        });
        SlowUpload { endpoint, stop }
    }
}

fn pump(mut from: TcpStream, mut to: TcpStream, rate: Option<u64>, stop: Arc<AtomicBool>) {
    let mut buf = [0u8; 16384];
    let (t0, mut sent) = (Instant::now(), 0u64);
    while let Ok(n) = from.read(&mut buf) {
        if n == 0 || stop.load(Ordering::Relaxed) || to.write_all(&buf[..n]).is_err() {
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
    let _ = to.shutdown(std::net::Shutdown::Both);
    let _ = from.shutdown(std::net::Shutdown::Both);
}

impl Drop for SlowUpload {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The stdout of a command that must have succeeded.
pub fn ok(o: &Output, what: &str) -> String {
    assert_ok(o, what);
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `inspect --json -D URL` through `srv`: every committed checkpoint,
/// each verified (inspect checks every checksum of what it fetched).
pub fn inspect_json(srv: &S3Server, url: &str, extra: &[&str]) -> Vec<serde_json::Value> {
    let o = srv
        .stasis()
        .args(["inspect", "--json", "-D", url])
        .args(extra)
        .output()
        .unwrap();
    let text = ok(&o, "inspect");
    let v: serde_json::Value =
        serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text}"));
    let arr = v.as_array().cloned().unwrap_or_default();
    assert!(arr.iter().all(|c| c["verified"] == true), "{text}");
    arr
}

/// Whether any file under the bucket's `prefix` holds one of `samples`.
pub fn holds_any(
    srv: &S3Server,
    prefix: &str,
    samples: &std::collections::HashSet<[u8; 32]>,
) -> bool {
    srv.stored_files()
        .iter()
        .filter(|(p, _)| p.starts_with(format!("{BUCKET}/{prefix}")))
        .any(|(_, b)| holds_sample(b, samples))
}

/// Whether `b` holds one of the 32-byte `samples`.
pub fn holds_sample(b: &[u8], samples: &std::collections::HashSet<[u8; 32]>) -> bool {
    b.windows(32)
        .any(|w| samples.contains(<&[u8; 32]>::try_from(w).unwrap()))
}

/// Whether the staging directory of the store whose URL ends in `suffix`
/// holds one of `samples`.
pub fn staged_holds(
    srv: &S3Server,
    suffix: &str,
    samples: &std::collections::HashSet<[u8; 32]>,
) -> bool {
    std::fs::read_dir(srv.staging.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|d| {
            std::fs::read_to_string(d.join("remote.json"))
                .is_ok_and(|t| t.contains(&format!("{suffix}\"")))
        })
        .flat_map(|d| super::files_under(&d).into_values())
        .any(|b| holds_sample(&b, samples))
}
