//! Redis under `redis-benchmark`: 5000 fixed keys (0.1 to 2 KB values, in
//! database 1) are stored first, then redis-benchmark's 8 clients run INCR
//! and LPUSH (20 000 requests each) through the checkpoint. After a plain
//! or lazy restore redis-benchmark goes on on its connections and ends
//! without an error; the counter is then exactly 20 000 and the list
//! exactly 20 000 long. After a concurrent dump the restored redis is back
//! at the dump instant: its counter between what was seen before the dump
//! and 20 000, the list empty unless the counter is complete. In every
//! mode the fixed keys are read back byte for byte, and redis serves on.

use crate::common::resp::*;
use crate::common::*;
use crate::harness::*;

use std::io::{BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};

const FIXED: u64 = 5000;
const REQUESTS: u64 = 20_000;

/// A redis connection (RESP), each reply read with a timeout.
struct Redis {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

impl Redis {
    fn connect(port: u16) -> Redis {
        let s = TcpStream::connect(("127.0.0.1", port)).expect("connect to redis");
        s.set_read_timeout(Some(PATIENCE)).expect("timeout");
        Redis {
            w: s.try_clone().expect("clone"),
            r: BufReader::new(s),
        }
    }

    fn recv(&mut self) -> Reply {
        read_reply(&mut self.r).expect("reply from redis")
    }

    fn call(&mut self, args: &[&[u8]]) -> Reply {
        self.w.write_all(&encode(args)).expect("send");
        self.recv()
    }

    fn int(&mut self, args: &[&[u8]]) -> i64 {
        match self.call(args) {
            Reply::Int(n) => n,
            Reply::Bulk(Some(b)) => String::from_utf8_lossy(&b).parse().expect("a number"),
            Reply::Bulk(None) => 0,
            r => panic!("{args:?}: {r:?}"),
        }
    }
}

fn fixed_key(i: u64) -> Vec<u8> {
    format!("fixed:{i}").into_bytes()
}

fn fixed_value(i: u64) -> Vec<u8> {
    value(i, 100 + usize::try_from(i * 7919 % 1900).expect("small"))
}

/// Every fixed key, read back (pipelined) from database 1.
fn verify_fixed(r: &mut Redis, what: &str) {
    assert_eq!(r.call(&[b"SELECT", b"1"]), Reply::Status("OK".into()));
    assert_eq!(
        r.int(&[b"DBSIZE"]),
        i64::try_from(FIXED).expect("small"),
        "{what}"
    );
    let mut buf = Vec::new();
    for i in 0..FIXED {
        buf.extend(encode(&[b"GET", &fixed_key(i)]));
    }
    r.w.write_all(&buf).expect("send");
    for i in 0..FIXED {
        assert!(
            r.recv() == Reply::Bulk(Some(fixed_value(i))),
            "{what}: fixed:{i} is not what was stored"
        );
    }
    assert_eq!(r.call(&[b"SELECT", b"0"]), Reply::Status("OK".into()));
}

pub fn benchmark(mode: Mode) {
    let port = free_port();
    let dir = Prog::dir("redis");
    let mut cmd = Command::new("redis-server");
    cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
        .arg("--dir")
        .arg(dir.path());
    let mut prog = Prog::start("redis", dir, cmd);
    prog.wait_port(port);
    let mut r = Redis::connect(port);
    assert_eq!(r.call(&[b"SELECT", b"1"]), Reply::Status("OK".into()));
    let mut buf = Vec::new();
    for i in 0..FIXED {
        buf.extend(encode(&[b"SET", &fixed_key(i), &fixed_value(i)]));
    }
    r.w.write_all(&buf).expect("send");
    for _ in 0..FIXED {
        assert_eq!(r.recv(), Reply::Status("OK".into()));
    }
    verify_fixed(&mut r, "before the load");

    let bench_out = prog.path("benchmark.log");
    // Waited for in each mode below (before the kill after a concurrent
    // dump, after the restore otherwise); `_guard` reaps it on a failure.
    #[allow(clippy::zombie_processes)]
    let mut bench = Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(["-c", "8", "-n", &REQUESTS.to_string(), "-t", "incr,lpush"])
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&bench_out).expect("benchmark.log"))
        .stderr(Stdio::piped())
        .spawn()
        .expect("running redis-benchmark (run scripts/setup.sh)");
    let _guard = KillOnDrop(i32::try_from(bench.id()).expect("pid"));
    let counter: &[u8] = b"counter:__rand_int__";
    prog.wait("redis-benchmark's first 2000 INCRs", || {
        r.int(&[b"GET", counter]) >= 2000
    });
    let before = r.int(&[b"GET", counter]);
    let fig = prog.checkpoint(mode);
    if mode == Mode::Concurrent {
        // redis served the benchmark on, to its end.
        let st = bench.wait().expect("wait redis-benchmark");
        assert!(st.success(), "redis-benchmark: {st}");
        assert_eq!(
            r.int(&[b"GET", counter]),
            i64::try_from(REQUESTS).expect("small")
        );
        prog.kill();
    }
    prog.restore(mode);
    let mut r = Redis::connect(port);
    let n = i64::try_from(REQUESTS).expect("small");
    if mode == Mode::Concurrent {
        let c = r.int(&[b"GET", counter]);
        let l = r.int(&[b"LLEN", b"mylist"]);
        assert!(
            (before..=n).contains(&c) && (l == 0 || c == n) && l <= n,
            "the restored image: counter {c} (was {before} before the dump), list {l}"
        );
        eprintln!("redis: restored at the dump instant: counter {c}, list {l}");
    } else {
        let mut err = String::new();
        let st = bench.wait().expect("wait redis-benchmark");
        if let Some(mut e) = bench.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        assert!(st.success(), "redis-benchmark: {st}: {err}");
        let log = std::fs::read_to_string(&bench_out).unwrap_or_default();
        assert!(
            !log.to_lowercase().contains("error") && !err.to_lowercase().contains("error"),
            "redis-benchmark: {log}\n{err}"
        );
        assert_eq!(r.int(&[b"GET", counter]), n, "every INCR counted once");
        assert_eq!(r.int(&[b"LLEN", b"mylist"]), n, "every LPUSH once");
    }
    verify_fixed(&mut r, "after the restore");
    prog.lazy_done();
    // It serves on: a short benchmark of new clients, then our own writes.
    let o = Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(["-c", "4", "-n", "2000", "-q", "-t", "set,get"])
        .stdin(Stdio::null())
        .output()
        .expect("redis-benchmark");
    assert_ok(&o, "redis-benchmark after the restore");
    assert_eq!(
        r.call(&[b"SET", b"after", b"restore"]),
        Reply::Status("OK".into())
    );
    assert_eq!(
        r.call(&[b"GET", b"after"]),
        Reply::Bulk(Some(b"restore".to_vec()))
    );
    eprintln!(
        "redis {mode:?}: {FIXED} keys verified, counter at {before} at the dump; frozen {} us, image {} MiB",
        fig.frozen_us,
        fig.bytes >> 20
    );
    r.w.write_all(&encode(&[b"SHUTDOWN", b"NOSAVE"]))
        .expect("send");
    let mut rest = Vec::new();
    let _ = r.r.read_to_end(&mut rest);
    assert_eq!(prog.reap(), (Some(0), None), "redis:\n{}", prog.tail());
}
