//! Key-value services: memcached (its text protocol) and the same small
//! HTTP key-value service written for Node.js, Go and the JVM
//! (tests/programs/kv_server.js, kvserver.go, KvServer.java), all holding
//! their data in memory only.
//!
//! The scenario: 1500 fixed keys (0.1 to 4 KB each, about 3 MB) are
//! stored, then four clients each write their own keys in sequence (and
//! read back an earlier one now and then) on one kept-alive connection,
//! through the checkpoint. After a plain or lazy restore every client goes
//! on on its connection, and the service must hold exactly the fixed keys
//! plus every key a client was acknowledged. After a concurrent dump it
//! must hold the fixed keys plus, per client, a prefix of its keys at least
//! as long as what was acknowledged before the dump began.

use crate::common::*;
use crate::harness::*;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::sync::OnceLock;

const FIXED: u64 = 1500;
const CLIENTS: u64 = 4;

fn fixed_key(i: u64) -> String {
    format!("fixed-{i:05}")
}

fn fixed_value(i: u64) -> Vec<u8> {
    value(i, 100 + usize::try_from(i * 2654 % 3900).expect("small"))
}

fn load_key(c: u64, j: u64) -> String {
    format!("load-{c}-{j:07}")
}

fn load_value(c: u64, j: u64) -> Vec<u8> {
    value(c << 32 | j, 64 + usize::try_from(j % 900).expect("small"))
}

/// A connection to a key-value service.
pub trait Kv: Send {
    fn set(&mut self, key: &str, value: &[u8]) -> std::io::Result<()>;
    fn get(&mut self, key: &str) -> std::io::Result<Option<Vec<u8>>>;
    /// The service's own "COUNT SHA256" of its whole data set, if it has one.
    fn digest(&mut self) -> std::io::Result<Option<String>>;
}

fn io_err(what: String) -> std::io::Error {
    std::io::Error::other(what)
}

/// A kept-alive HTTP/1.1 connection to the key-value service.
pub struct Http {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

impl Http {
    pub fn connect(port: u16) -> std::io::Result<Http> {
        let s = TcpStream::connect(("127.0.0.1", port))?;
        s.set_read_timeout(Some(PATIENCE))?;
        s.set_nodelay(true)?;
        Ok(Http {
            w: s.try_clone()?,
            r: BufReader::new(s),
        })
    }

    /// One request; returns (status, body).
    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        body: &[u8],
    ) -> std::io::Result<(u32, Vec<u8>)> {
        let mut req = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        req.extend_from_slice(body);
        self.w.write_all(&req)?;
        let mut line = String::new();
        self.r.read_line(&mut line)?;
        let status: u32 = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| io_err(format!("bad status line {line:?}")))?;
        let mut len = None;
        let mut chunked = false;
        loop {
            let mut h = String::new();
            if self.r.read_line(&mut h)? == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            let (k, v) = h.split_once(':').unwrap_or((h, ""));
            match k.to_ascii_lowercase().as_str() {
                "content-length" => len = v.trim().parse::<usize>().ok(),
                "transfer-encoding" => chunked = v.trim().eq_ignore_ascii_case("chunked"),
                _ => {}
            }
        }
        let mut body = Vec::new();
        if chunked {
            loop {
                let mut size = String::new();
                self.r.read_line(&mut size)?;
                let n = usize::from_str_radix(size.trim(), 16)
                    .map_err(|_| io_err(format!("bad chunk size {size:?}")))?;
                let mut chunk = vec![0; n + 2];
                self.r.read_exact(&mut chunk)?;
                chunk.truncate(n);
                body.extend(chunk);
                if n == 0 {
                    break;
                }
            }
        } else {
            body.resize(len.unwrap_or(0), 0);
            self.r.read_exact(&mut body)?;
        }
        Ok((status, body))
    }
}

impl Kv for Http {
    fn set(&mut self, key: &str, value: &[u8]) -> std::io::Result<()> {
        match self.request("PUT", &format!("/k/{key}"), value)? {
            (200, b) if b == b"ok" => Ok(()),
            (s, b) => Err(io_err(format!(
                "PUT {key}: {s} {}",
                String::from_utf8_lossy(&b)
            ))),
        }
    }

    fn get(&mut self, key: &str) -> std::io::Result<Option<Vec<u8>>> {
        match self.request("GET", &format!("/k/{key}"), b"")? {
            (200, b) => Ok(Some(b)),
            (404, _) => Ok(None),
            (s, _) => Err(io_err(format!("GET {key}: {s}"))),
        }
    }

    fn digest(&mut self) -> std::io::Result<Option<String>> {
        match self.request("GET", "/digest", b"")? {
            (200, b) => Ok(Some(String::from_utf8_lossy(&b).into_owned())),
            (s, _) => Err(io_err(format!("GET /digest: {s}"))),
        }
    }
}

/// A memcached connection (text protocol).
pub struct Memcached {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

impl Memcached {
    pub fn connect(port: u16) -> std::io::Result<Memcached> {
        let s = TcpStream::connect(("127.0.0.1", port))?;
        s.set_read_timeout(Some(PATIENCE))?;
        s.set_nodelay(true)?;
        Ok(Memcached {
            w: s.try_clone()?,
            r: BufReader::new(s),
        })
    }

    fn line(&mut self) -> std::io::Result<String> {
        let mut l = String::new();
        if self.r.read_line(&mut l)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        Ok(l.trim_end().to_string())
    }

    /// `stats` as (name, value) pairs.
    pub fn stats(&mut self) -> std::io::Result<Vec<(String, String)>> {
        self.w.write_all(b"stats\r\n")?;
        let mut out = Vec::new();
        loop {
            let l = self.line()?;
            if l == "END" {
                return Ok(out);
            }
            let mut w = l.split_whitespace().skip(1);
            if let (Some(k), Some(v)) = (w.next(), w.next()) {
                out.push((k.to_string(), v.to_string()));
            }
        }
    }
}

impl Kv for Memcached {
    fn set(&mut self, key: &str, value: &[u8]) -> std::io::Result<()> {
        let mut req = format!("set {key} 0 0 {}\r\n", value.len()).into_bytes();
        req.extend_from_slice(value);
        req.extend_from_slice(b"\r\n");
        self.w.write_all(&req)?;
        match self.line()?.as_str() {
            "STORED" => Ok(()),
            l => Err(io_err(format!("set {key}: {l}"))),
        }
    }

    fn get(&mut self, key: &str) -> std::io::Result<Option<Vec<u8>>> {
        self.w.write_all(format!("get {key}\r\n").as_bytes())?;
        let l = self.line()?;
        if l == "END" {
            return Ok(None);
        }
        let n: usize = l
            .strip_prefix(&format!("VALUE {key} 0 "))
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| io_err(format!("get {key}: {l}")))?;
        let mut v = vec![0; n + 2];
        self.r.read_exact(&mut v)?;
        v.truncate(n);
        match self.line()?.as_str() {
            "END" => Ok(Some(v)),
            l => Err(io_err(format!("get {key}: {l} after the value"))),
        }
    }

    fn digest(&mut self) -> std::io::Result<Option<String>> {
        Ok(None)
    }
}

/// The "COUNT SHA256" the HTTP services compute over `entries`.
fn model_digest(entries: &std::collections::BTreeMap<String, Vec<u8>>) -> String {
    let mut all = Vec::new();
    for (k, v) in entries {
        all.extend_from_slice(k.as_bytes());
        all.push(0);
        all.extend_from_slice(v);
        all.push(b'\n');
    }
    format!("{} {}", entries.len(), sha256_hex(&all))
}

/// Checks the service holds exactly `model` (and, `extra` keys of each
/// client beyond it, none).
fn verify(kv: &mut dyn Kv, model: &std::collections::BTreeMap<String, Vec<u8>>, what: &str) {
    for (k, v) in model {
        let got = kv.get(k).expect("get");
        assert!(
            got.as_deref() == Some(v.as_slice()),
            "{what}: {k}: {} bytes, want {}",
            got.map_or(-1, |g| i64::try_from(g.len()).unwrap_or(-1)),
            v.len()
        );
    }
    if let Some(d) = kv.digest().expect("digest") {
        assert_eq!(d, model_digest(model), "{what}: the service's digest");
    }
}

/// The restored length of each client's prefix: the first j with no key.
fn prefix_len(kv: &mut dyn Kv, c: u64, from: u64, to: u64) -> u64 {
    (from..=to)
        .find(|&j| kv.get(&load_key(c, j)).expect("get").is_none())
        .unwrap_or_else(|| {
            panic!("client {c}: keys up to {to} all present, more than were written")
        })
}

/// The scenario over a started service listening on `port`.
fn scenario(
    prog: &mut Prog,
    mode: Mode,
    connect: fn(u16) -> std::io::Result<Box<dyn Kv>>,
    port: u16,
) {
    prog.wait_port(port);
    let mut admin = connect(port).expect("connect");
    let mut model = std::collections::BTreeMap::new();
    for i in 0..FIXED {
        admin.set(&fixed_key(i), &fixed_value(i)).expect("set");
        model.insert(fixed_key(i), fixed_value(i));
    }
    verify(admin.as_mut(), &model, "before the load");
    let clients: Vec<Step> = (0..CLIENTS)
        .map(|c| {
            let mut kv = connect(port).expect("connect");
            Box::new(move |j: u64| {
                kv.set(&load_key(c, j), &load_value(c, j))
                    .map_err(|e| e.to_string())?;
                if j % 16 == 15 {
                    let back = j * 7 / 11;
                    let got = kv.get(&load_key(c, back)).map_err(|e| e.to_string())?;
                    if got != Some(load_value(c, back)) {
                        return Err(format!("key {back} read back wrong"));
                    }
                }
                Ok(())
            }) as Step
        })
        .collect();
    let load = Load::start(clients);
    let zero = vec![0; usize::try_from(CLIENTS).expect("small")];
    load.wait_beyond(prog, &zero, 200, "200 writes per client before the dump");
    let before = load.counts();
    let fig = prog.checkpoint(mode);
    let at_dump = load.counts();
    eprintln!(
        "{}: writes per client before {before:?}, when the dump returned {at_dump:?}",
        prog.name
    );
    if mode == Mode::Concurrent {
        // The service ran on, serving the clients, during and after the copy.
        load.wait_beyond(prog, &at_dump, 100, "writes after the concurrent dump");
        let written = load.finish();
        prog.kill();
        prog.restore(mode);
        let mut kv = connect(port).expect("connect to the restored service");
        for c in 0..CLIENTS {
            let i = usize::try_from(c).expect("small");
            let m = prefix_len(kv.as_mut(), c, before[i], written[i] + 1);
            for j in 0..m {
                model.insert(load_key(c, j), load_value(c, j));
            }
        }
        verify(kv.as_mut(), &model, "the restored concurrent image");
    } else {
        prog.restore(mode);
        // The clients go on, on their connections.
        load.wait_beyond(prog, &at_dump, 100, "writes after the restore");
        let written = load.finish();
        for c in 0..CLIENTS {
            let i = usize::try_from(c).expect("small");
            for j in 0..written[i] {
                model.insert(load_key(c, j), load_value(c, j));
            }
        }
        let mut kv = connect(port).expect("connect to the restored service");
        verify(kv.as_mut(), &model, "after the restore");
        for c in 0..CLIENTS {
            let next = load_key(c, written[usize::try_from(c).expect("small")]);
            assert_eq!(
                kv.get(&next).expect("get"),
                None,
                "{next} was never written"
            );
        }
    }
    prog.lazy_done();
    // It serves on: new writes, read back, on a new connection.
    let mut kv = connect(port).expect("connect");
    for i in 0..200 {
        let k = format!("after-{i}");
        kv.set(&k, &value(i + 7, 300))
            .expect("set after the restore");
        model.insert(k, value(i + 7, 300));
    }
    verify(kv.as_mut(), &model, "after new writes");
    let mb = model.values().map(Vec::len).sum::<usize>() >> 20;
    eprintln!(
        "{} {mode:?}: {} keys ({mb} MiB) verified; frozen {} us, image {} MiB",
        prog.name,
        model.len(),
        fig.frozen_us,
        fig.bytes >> 20
    );
}

pub fn memcached(mode: Mode) {
    let port = free_port();
    let mut cmd = Command::new("memcached");
    cmd.args(["-l", "127.0.0.1", "-p", &port.to_string(), "-U", "0"])
        .args(["-t", "4", "-m", "64", "-u", "root"]);
    let mut prog = Prog::start("memcached", Prog::dir("memcached"), cmd);
    scenario(
        &mut prog,
        mode,
        |p| Ok(Box::new(Memcached::connect(p)?) as Box<dyn Kv>),
        port,
    );
    let mut m = Memcached::connect(port).expect("connect");
    let items = m.stats().expect("stats");
    let threads = items.iter().find(|(k, _)| k == "threads");
    assert_eq!(threads.map(|t| t.1.as_str()), Some("4"), "{items:?}");
    prog.stop(libc::SIGTERM, 0);
}

fn http(p: u16) -> std::io::Result<Box<dyn Kv>> {
    Ok(Box::new(Http::connect(p)?) as Box<dyn Kv>)
}

/// Starts an HTTP key-value service with `cmd PORT PIDFILE` and runs the
/// scenario; then SIGTERM must end it with `code`.
fn http_service(name: &str, mode: Mode, cmd: impl FnOnce() -> Command, code: i32) {
    let port = free_port();
    let dir = Prog::dir(name);
    let pidfile = dir.path().join("pid");
    let mut c = cmd();
    c.arg(port.to_string()).arg(&pidfile);
    let mut prog = Prog::start(name, dir, c);
    prog.wait_pidfile(&pidfile);
    scenario(&mut prog, mode, http, port);
    prog.stop(libc::SIGTERM, code);
}

pub fn node(mode: Mode) {
    http_service(
        "node",
        mode,
        || {
            let mut c = Command::new("node");
            c.arg(programs_dir().join("kv_server.js"));
            c
        },
        0,
    );
}

/// Builds `tests/programs/kvserver.go` once per test binary.
fn go_binary() -> &'static std::path::Path {
    static BIN: OnceLock<std::path::PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let out = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("kvserver");
        let o = Command::new("go")
            .arg("build")
            .arg("-o")
            .arg(&out)
            .arg(programs_dir().join("kvserver.go"))
            .env("GO111MODULE", "off")
            .output()
            .expect("running go build (is Go installed? run scripts/setup.sh)");
        assert_ok(&o, "go build kvserver.go");
        out
    })
}

pub fn go(mode: Mode) {
    let bin = go_binary();
    // Go's default SIGTERM action: killed by the signal.
    let port = free_port();
    let dir = Prog::dir("go");
    let pidfile = dir.path().join("pid");
    let mut c = Command::new(bin);
    c.arg(port.to_string()).arg(&pidfile);
    let mut prog = Prog::start("go", dir, c);
    prog.wait_pidfile(&pidfile);
    scenario(&mut prog, mode, http, port);
    // SAFETY: signalling the program we started.
    unsafe { libc::kill(prog.pid, libc::SIGTERM) };
    assert_eq!(prog.reap(), (None, Some(libc::SIGTERM)), "{}", prog.tail());
}

/// Compiles `tests/programs/KvServer.java` once per test binary.
fn java_classes() -> &'static std::path::Path {
    static DIR: OnceLock<std::path::PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let out = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("kvserver-classes");
        let o = Command::new("javac")
            .arg("-nowarn")
            .arg("-d")
            .arg(&out)
            .arg(programs_dir().join("KvServer.java"))
            .output()
            .expect("running javac (is a JDK installed? run scripts/setup.sh)");
        assert_ok(&o, "javac KvServer.java");
        out
    })
}

pub fn jvm(mode: Mode) {
    let classes = java_classes();
    // The JVM exits 143 on SIGTERM (its shutdown hooks ran).
    http_service(
        "jvm",
        mode,
        || {
            let mut c = Command::new("java");
            // TCP_NODELAY on the server's sockets: without it each reply
            // (headers, then body) waits out a delayed ACK (40 ms).
            c.args(["-Xmx256m", "-Dsun.net.httpserver.nodelay=true", "-cp"])
                .arg(classes)
                .arg("KvServer");
            c
        },
        143,
    );
}
