//! A TCP server that crashes right after a checkpoint that left it running
//! must be restorable at once (issue 12).
//!
//! Repair mode, which a dump uses to read each established connection,
//! forces address reuse while on and clears it when left: connections left
//! so went to TIME_WAIT/FIN_WAIT2, when the server died, unwilling to share
//! their port, and the restored listener could not bind it for a minute
//! ("port N of fd M is taken by another process"). These tests check that
//! `SO_REUSEADDR` is as the program set it on every socket after a
//! `--leave-running` dump (plain and `--concurrent`) and after a restore,
//! and that a server SIGKILLed with live client connections right after
//! such a dump is restored at once and serves its data, by hand and under
//! `stasis run --restart-on-failure`; and that a dumper killed at any
//! instant (mid-dump, after its commit, halfway through its kill of the
//! tree) leaves redis either running with its connections as they were or
//! dead and restorable with its clients still connected.
//!
//! Needs redis-server (scripts/setup.sh).

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::fd::{FromRawFd, OwnedFd};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::*;

/// What a dump touches on a TCP socket, and its state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SockState {
    reuseaddr: i32,
    state: u8,
    /// `TCP_REPAIR` (1 in repair mode).
    repair: i32,
    /// Instructions of its socket filter (0: none).
    filter: u32,
    /// The send window (`tcpi_snd_wnd`): a dump holds it at zero while it
    /// reads the connection, and gives it back.
    snd_wnd: u32,
}

/// [`SockState`] of every TCP socket of `pid`, by fd number, read through a
/// copy of each fd (`pidfd_getfd`).
fn tcp_reuse(pid: i32) -> BTreeMap<i32, SockState> {
    let mut out = BTreeMap::new();
    // SAFETY: pidfd_open with integer arguments; returns a new fd or -1.
    let pfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    assert!(
        pfd >= 0,
        "pidfd_open({pid}): {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: a new fd that nothing else owns.
    let pfd = unsafe { OwnedFd::from_raw_fd(i32::try_from(pfd).unwrap()) };
    for e in std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("fd dir")
        .flatten()
    {
        let Ok(fd) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let link = std::fs::read_link(e.path()).unwrap_or_default();
        if !link.to_string_lossy().starts_with("socket:") {
            continue;
        }
        use std::os::fd::AsRawFd;
        // SAFETY: pidfd_getfd with integer arguments; returns a new fd or -1.
        let s = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pfd.as_raw_fd(), fd, 0) };
        if s < 0 {
            continue;
        }
        // SAFETY: a new fd that nothing else owns.
        let s = unsafe { OwnedFd::from_raw_fd(i32::try_from(s).unwrap()) };
        let get = |level: i32, opt: i32| -> i32 {
            let mut v: libc::c_int = -1;
            let mut len = libc::socklen_t::try_from(std::mem::size_of::<libc::c_int>()).unwrap();
            // SAFETY: getsockopt writes at most `len` bytes into `v`.
            let r = unsafe {
                libc::getsockopt(
                    s.as_raw_fd(),
                    level,
                    opt,
                    (&mut v as *mut libc::c_int).cast(),
                    &mut len,
                )
            };
            if r < 0 {
                -1
            } else {
                v
            }
        };
        let inet = matches!(
            get(libc::SOL_SOCKET, libc::SO_DOMAIN),
            libc::AF_INET | libc::AF_INET6
        );
        if !inet || get(libc::SOL_SOCKET, libc::SO_PROTOCOL) != libc::IPPROTO_TCP {
            continue;
        }
        let mut info = [0u8; 240];
        let mut len = libc::socklen_t::try_from(info.len()).unwrap();
        // SAFETY: TCP_INFO writes at most `len` bytes into `info`; the first
        // byte is the state, `tcpi_snd_wnd` the u32 at 228 (Linux 6.2+).
        let r = unsafe {
            libc::getsockopt(
                s.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_INFO,
                info.as_mut_ptr().cast(),
                &mut len,
            )
        };
        assert!(r == 0 && len >= 232, "TCP_INFO of fd {fd}: {len} bytes");
        let mut filter: libc::socklen_t = 0;
        // SAFETY: SO_GET_FILTER with a zero length only reports the
        // filter's instruction count into `filter`.
        unsafe {
            libc::getsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_ATTACH_FILTER,
                std::ptr::null_mut(),
                &mut filter,
            )
        };
        out.insert(
            fd,
            SockState {
                reuseaddr: get(libc::SOL_SOCKET, libc::SO_REUSEADDR),
                state: info[0],
                repair: get(libc::IPPROTO_TCP, 19),
                filter,
                snd_wnd: u32::from_ne_bytes(info[228..232].try_into().unwrap()),
            },
        );
    }
    out
}

/// States (`/proc/net/tcp` hex codes) of the sockets whose local port is
/// `port`, other than the listener.
fn states_on_port(port: u16) -> Vec<String> {
    let want = format!(":{port:04X}");
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(1)?.ends_with(&want) && f.get(3) != Some(&"0A"))
                .then(|| f.get(3).map(|s| s.to_string()))?
        })
        .collect()
}

/// After a crash, the connections of the dead server that keep its port:
/// FIN_WAIT1/2 (04, 05), TIME_WAIT (06), CLOSING (0B).
fn wait_lingering(port: u16) -> Vec<String> {
    let t0 = Instant::now();
    loop {
        let s: Vec<String> = states_on_port(port)
            .into_iter()
            .filter(|s| matches!(s.as_str(), "04" | "05" | "06" | "0B"))
            .collect();
        if !s.is_empty() {
            return s;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "no connection of the killed server lingers on port {port}: {:?}",
            states_on_port(port)
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// One `--leave-running` dump (with `extra` flags) of the sockets workload:
/// every TCP socket keeps its `SO_REUSEADDR`; killed right after and
/// restored, every restored socket has it as the program set it, and the
/// workload checks its sockets and their data.
/// (One dump per workload: a second dump of the same process would miss
/// the empty datagrams of its queues, which the first one's peek marked
/// as peeked: see the report of issue 12.)
fn reuseaddr_kept(extra: &[&str]) {
    let mut w = Workload::start("sockets", &[]);
    // Both ends of its connections are in the workload, which moves data
    // and re-advertises its windows: a window is compared as open or not.
    let tcp_reuse = |pid| {
        let mut m = tcp_reuse(pid);
        for s in m.values_mut() {
            s.snd_wnd = s.snd_wnd.min(1);
        }
        m
    };
    let before = tcp_reuse(w.pid);
    // ltcp and the accepted ts have SO_REUSEADDR, the client tc has not.
    let established: Vec<i32> = before
        .values()
        .filter(|s| s.state == 1)
        .map(|s| s.reuseaddr)
        .collect();
    assert!(
        established.contains(&1) && established.contains(&0),
        "the sockets workload should hold connections with and without SO_REUSEADDR: {before:?}"
    );
    let mut flags = vec!["--leave-running"];
    flags.extend_from_slice(extra);
    let o = w.dump(&flags);
    assert_ok(&o, &format!("dump {flags:?}"));
    assert_eq!(
        tcp_reuse(w.pid),
        before,
        "SO_REUSEADDR and states of the TCP sockets after dump {flags:?}"
    );
    // Killed at once: its connections close (one end stays in TIME_WAIT).
    // SAFETY: killing our workload.
    unsafe { libc::kill(w.pid, libc::SIGKILL) };
    assert_eq!(w.reap(), (None, Some(libc::SIGKILL)));
    w.restore(&[]);
    assert_eq!(
        tcp_reuse(w.pid),
        before,
        "SO_REUSEADDR and states of the restored TCP sockets"
    );
    w.finish_pass();
}

#[test]
fn reuseaddr_as_set_by_the_program_after_leave_running_dump_and_restore() {
    reuseaddr_kept(&[]);
}

#[test]
fn reuseaddr_as_set_by_the_program_after_concurrent_dump_and_restore() {
    reuseaddr_kept(&["--concurrent"]);
}

// ---- redis --------------------------------------------------------------

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A minimal RESP client: commands as arrays of bulk strings, replies read
/// with a timeout.
struct Redis {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

impl Redis {
    fn connect(port: u16) -> std::io::Result<Redis> {
        let s = TcpStream::connect(("127.0.0.1", port))?;
        s.set_read_timeout(Some(Duration::from_secs(15)))?;
        Ok(Redis {
            w: s.try_clone()?,
            r: BufReader::new(s),
        })
    }

    fn wait_connect(port: u16, alive_pid: Option<i32>) -> Redis {
        let t0 = Instant::now();
        loop {
            if let Ok(mut r) = Redis::connect(port) {
                if r.call(&[b"PING"]) == b"+PONG" {
                    return r;
                }
            }
            if let Some(p) = alive_pid {
                assert!(alive(p), "redis {p} died");
            }
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "redis does not serve on {port}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends a command and returns the reply: a status/error/int line as
    /// is (with its type byte), a bulk string as its content.
    fn call(&mut self, args: &[&[u8]]) -> Vec<u8> {
        if !self.send(args) {
            return b"-write failed".to_vec();
        }
        self.reply()
    }

    /// Sends a command without waiting for its reply.
    fn send(&mut self, args: &[&[u8]]) -> bool {
        let mut v = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            v.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            v.extend_from_slice(a);
            v.extend_from_slice(b"\r\n");
        }
        self.w.write_all(&v).is_ok()
    }

    /// The next reply, as [`Redis::call`] returns it.
    fn reply(&mut self) -> Vec<u8> {
        let mut line = Vec::new();
        if self.r.read_until(b'\n', &mut line).is_err() || !line.ends_with(b"\r\n") {
            return b"-read failed".to_vec();
        }
        line.truncate(line.len() - 2);
        if line.first() == Some(&b'$') {
            let n: i64 = String::from_utf8_lossy(&line[1..]).parse().unwrap_or(-1);
            let Ok(n) = usize::try_from(n) else {
                return b"(nil)".to_vec();
            };
            let mut b = vec![0; n + 2];
            if self.r.read_exact(&mut b).is_err() {
                return b"-read failed".to_vec();
            }
            b.truncate(n);
            return b;
        }
        line
    }
}

const KEYS: usize = 500;

fn value(i: usize) -> Vec<u8> {
    let n = 100 + (i * 7919) % 900;
    (0..n)
        .map(|j| b'a' + u8::try_from((i * 31 + j * 7) % 26).unwrap())
        .collect()
}

fn fill_keys(r: &mut Redis) {
    for i in 0..KEYS {
        assert_eq!(
            r.call(&[b"SET", format!("key:{i}").as_bytes(), &value(i)]),
            b"+OK"
        );
    }
}

fn check_keys(r: &mut Redis) {
    for i in 0..KEYS {
        assert_eq!(
            r.call(&[b"GET", format!("key:{i}").as_bytes()]),
            value(i),
            "key:{i} after the restore"
        );
    }
    assert_eq!(r.call(&[b"SET", b"after", b"restore"]), b"+OK");
    assert_eq!(r.call(&[b"GET", b"after"]), b"restore");
}

/// A new client of the restored redis `pid` on `port` finds every key; then
/// redis is shut down and exits 0.
fn check_and_shut_down_restored(port: u16, pid: i32) {
    let mut r = Redis::wait_connect(port, Some(pid));
    check_keys(&mut r);
    assert_eq!(r.call(&[b"SHUTDOWN", b"NOSAVE"]), b"-read failed");
    assert_eq!(
        waitpid_timeout(pid, Duration::from_secs(20)),
        (Some(0), None)
    );
}

fn redis_cmd(port: u16, dir: &std::path::Path) -> Command {
    let mut c = Command::new("redis-server");
    c.args(["--port", &port.to_string()])
        .args(["--bind", "127.0.0.1"])
        .args(["--save", ""])
        .args(["--appendonly", "no"])
        .args(["--daemonize", "no"])
        .arg("--dir")
        .arg(dir);
    c
}

fn redis_crash_after_leave_running(extra: &[&str]) {
    let d = tempfile::tempdir().unwrap();
    let images = d.path().join("images");
    // Clients connected at the time of the checkpoint and of the crash.
    let (mut child, pid, port, admin, mut clients) = redis_with_clients(d.path(), 4);
    let _guard = KillOnDrop(pid);
    let before = tcp_reuse(pid);
    assert!(
        before
            .values()
            .filter(|s| s.state == 1 && s.reuseaddr == 1)
            .count()
            >= 5,
        "redis' accepted connections should have SO_REUSEADDR: {before:?}"
    );
    let o = stasis()
        .args(["dump", "-t", &pid.to_string(), "-D"])
        .arg(&images)
        .arg("--leave-running")
        .args(extra)
        .output()
        .expect("stasis dump");
    assert_ok(&o, &format!("dump --leave-running {extra:?} of redis"));
    assert_eq!(tcp_reuse(pid), before, "redis' TCP sockets after the dump");
    for c in &mut clients {
        assert_eq!(c.call(&[b"PING"]), b"+PONG", "redis serves after the dump");
    }
    // The crash, with every client connected.
    // SAFETY: killing the redis we started.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let st = child.wait().expect("wait redis");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(st.signal(), Some(libc::SIGKILL));
    // Its connections keep the port (FIN_WAIT2, then TIME_WAIT once the
    // clients, seeing the end of the stream, close theirs).
    let lingering = wait_lingering(port);
    drop(clients);
    drop(admin);
    eprintln!("after the crash, on port {port}: {lingering:?}");
    let t0 = Instant::now();
    let o = stasis()
        .args(["restore", "--detach", "-D"])
        .arg(&images)
        .output()
        .expect("stasis restore");
    assert_ok(&o, "restore of redis right after its crash");
    eprintln!(
        "restored in {:?} with {:?} on port {port}",
        t0.elapsed(),
        states_on_port(port)
    );
    assert!(alive(pid), "restored redis is not running");
    check_and_shut_down_restored(port, pid);
}

#[test]
fn redis_killed_after_leave_running_dump_restores_at_once() {
    redis_crash_after_leave_running(&[]);
}

#[test]
fn redis_killed_after_concurrent_dump_restores_at_once() {
    redis_crash_after_leave_running(&["--concurrent"]);
}

/// Lines of a child's stdout, as they come.
fn lines_of(child: &mut Child) -> mpsc::Receiver<String> {
    let out = child.stdout.take().expect("piped stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    rx
}

/// Waits for the next JSON event named `name` (up to `secs`).
fn next_event(rx: &mpsc::Receiver<String>, name: &str, secs: u64) -> serde_json::Value {
    next_event_or(rx, name, secs, &String::new)
}

/// [`next_event`], with `why()` (what the command logged, say) in the
/// failure.
fn next_event_or(
    rx: &mpsc::Receiver<String>,
    name: &str,
    secs: u64,
    why: &dyn Fn() -> String,
) -> serde_json::Value {
    let t0 = Instant::now();
    loop {
        let left = Duration::from_secs(secs).saturating_sub(t0.elapsed());
        let l = rx
            .recv_timeout(left)
            .unwrap_or_else(|e| panic!("no {name} event within {secs} s ({e}){}", why()));
        let v: serde_json::Value = serde_json::from_str(&l).unwrap_or_else(|e| panic!("{e}: {l}"));
        if v["event"] == name {
            return v;
        }
        assert!(
            v["event"] != "exited",
            "stasis run: the job exited while waiting for {name}: {v}"
        );
    }
}

#[test]
fn run_restarts_a_crashed_redis_at_once() {
    workloads();
    let d = tempfile::tempdir().unwrap();
    let port = free_port();
    let redis = redis_cmd(port, d.path());
    let mut c = stasis();
    c.arg("run")
        .arg("-D")
        .arg(d.path().join("img"))
        .args(["--every", "0.3", "--restart-on-failure", "--json", "--"])
        .arg(redis.get_program())
        .args(redis.get_args())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(d.path().join("run.err")).unwrap());
    let run_err = || {
        format!(
            "; stasis run logged:\n{}",
            std::fs::read_to_string(d.path().join("run.err")).unwrap_or_default()
        )
    };
    let mut run = c.spawn().expect("stasis run");
    let events = lines_of(&mut run);
    let started = next_event(&events, "started", 30);
    let pid = i32::try_from(started["pid"].as_i64().expect("pid")).unwrap();
    let _guard = KillOnDrop(pid);
    let mut admin = Redis::wait_connect(port, Some(pid));
    fill_keys(&mut admin);
    let mut clients: Vec<Redis> = (0..4)
        .map(|_| Redis::wait_connect(port, Some(pid)))
        .collect();
    // A checkpoint that has every key and client. Checkpoints ran while
    // the keys went in (a slow fill under load sees several): their events
    // wait in the channel, so they are dropped first. Of the next two, the
    // first may have begun before the last key; the second began after it.
    while let Ok(l) = events.try_recv() {
        assert!(!l.contains("\"exited\""), "stasis run: the job exited: {l}");
    }
    next_event(&events, "checkpoint", 30);
    next_event(&events, "checkpoint", 30);
    for c in &mut clients {
        assert_eq!(c.call(&[b"PING"]), b"+PONG");
    }
    // SAFETY: crashing the job under test.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let t0 = Instant::now();
    let restored = next_event_or(&events, "restored", 30, &run_err);
    let took = t0.elapsed();
    eprintln!("restarted after {took:?}: {restored}");
    assert_eq!(restored["pid"], pid);
    assert!(
        took < Duration::from_secs(10),
        "the restart took {took:?} (a port held by TIME_WAIT connections?)"
    );
    drop(clients);
    drop(admin);
    let mut r = Redis::wait_connect(port, Some(pid));
    check_keys(&mut r);
    assert_eq!(r.call(&[b"SHUTDOWN", b"NOSAVE"]), b"-read failed");
    let o = run.wait_with_output().expect("stasis run");
    assert_eq!(
        o.status.code(),
        Some(0),
        "stasis run exits with redis' status"
    );
}

/// A dumper SIGKILLed at each step of reading redis' connections (its
/// owners held, then every connection in repair mode, read, out of repair
/// mode again; behind the network lock, and its listener behind the accept
/// gate), in a dump that leaves the tree running and in one that would
/// kill it: the kernel lets redis go at once, but it runs no instruction
/// until the guard process has put every socket back as it was (filter,
/// repair mode, `SO_REUSEADDR`, and the send window the dump held at zero)
/// and continued it (it never runs with a connection in repair mode, where a
/// read fails and a write goes to its own receive queue); then redis
/// serves its clients on their old connections and new ones.
#[test]
fn a_killed_dumper_leaves_redis_connections_as_they_were() {
    for step in 1..=4 {
        for leave_running in [true, false] {
            let ctx = format!("die-in-tcp-repair:{step}, leave running: {leave_running}");
            let d = tempfile::tempdir().unwrap();
            let (mut child, pid, port, mut admin, mut clients) = redis_with_clients(d.path(), 3);
            let _guard = KillOnDrop(pid);
            let before = tcp_reuse(pid);
            assert!(before.values().all(|s| s.repair == 0), "{ctx}: {before:?}");
            let mut dump = stasis();
            dump.args(["dump", "-t", &pid.to_string(), "-D"])
                .arg(d.path().join("images"))
                .env("STASIS_FAULT", format!("die-in-tcp-repair:{step}"));
            if leave_running {
                dump.arg("--leave-running");
            }
            let o = dump.output().expect("stasis dump");
            use std::os::unix::process::ExitStatusExt;
            assert_eq!(
                o.status.signal(),
                Some(libc::SIGKILL),
                "{ctx}: the dump should have died: {}",
                String::from_utf8_lossy(&o.stderr)
            );
            // The guard puts the sockets back, then continues redis.
            let t0 = Instant::now();
            loop {
                if let Some(st) = child.try_wait().unwrap() {
                    panic!("{ctx}: redis died when the dumper was killed: {st}");
                }
                let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
                let running = status.contains("TracerPid:\t0\n") && !status.contains("State:\tT");
                let now = tcp_reuse(pid);
                if running && now == before {
                    break;
                }
                assert!(
                    t0.elapsed() < Duration::from_secs(30),
                    "{ctx}: after the dumper was killed, redis stays traced or stopped, or its sockets changed: {now:?}, before {before:?}\n{status}"
                );
                std::thread::sleep(Duration::from_millis(10));
            }
            for c in &mut clients {
                assert_eq!(
                    c.call(&[b"PING"]),
                    b"+PONG",
                    "{ctx}: an old connection after the killed dump"
                );
            }
            check_keys(&mut admin);
            let mut fresh = Redis::wait_connect(port, Some(pid));
            check_keys(&mut fresh);
            assert_eq!(fresh.call(&[b"SHUTDOWN", b"NOSAVE"]), b"-read failed");
            assert_eq!(child.wait().unwrap().code(), Some(0), "{ctx}");
        }
    }
}

/// A redis on a free port of its own, with the test keys and `n` extra
/// clients connected: (redis, pid, port, admin client, clients).
fn redis_with_clients(dir: &std::path::Path, n: usize) -> (Child, i32, u16, Redis, Vec<Redis>) {
    workloads(); // subreaper, for a restored redis
    let port = free_port();
    let mut c = redis_cmd(port, dir);
    c.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    close_inherited_fds(&mut c);
    let child = c
        .spawn()
        .expect("starting redis-server (run scripts/setup.sh)");
    let pid = i32::try_from(child.id()).unwrap();
    let mut admin = Redis::wait_connect(port, Some(pid));
    fill_keys(&mut admin);
    let clients = (0..n)
        .map(|_| Redis::wait_connect(port, Some(pid)))
        .collect();
    (child, pid, port, admin, clients)
}

/// `stasis dump` of `pid` (the tree killed once committed) that SIGKILLs
/// itself at fault point `die`.
fn dump_dying_at(pid: i32, images: &std::path::Path, die: &str) {
    let o = stasis()
        .args(["dump", "-t", &pid.to_string(), "-D"])
        .arg(images)
        .env("STASIS_FAULT", format!("{die}:1"))
        .output()
        .expect("stasis dump");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        o.status.signal(),
        Some(libc::SIGKILL),
        "the dump should have died at {die}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// A dump that kills the tree dies once its checkpoint is committed and
/// redis, the owner of the connections, is killed (by the socket guard, to
/// which the dumper hands the kill): its connections close in repair mode,
/// so the clients never see them end, and the restored redis answers them
/// on their old connections. (Were the guard to put the sockets back, as
/// for a dumper that died before the commit, each client would read the end
/// of its stream.)
#[test]
fn a_dumper_killed_after_the_kill_leaves_redis_restorable_with_its_clients() {
    let d = tempfile::tempdir().unwrap();
    let images = d.path().join("images");
    let (mut child, pid, port, admin, mut clients) = redis_with_clients(d.path(), 3);
    let _guard = KillOnDrop(pid);
    dump_dying_at(pid, &images, "die-after-kill");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        child.wait().unwrap().signal(),
        Some(libc::SIGKILL),
        "redis should have been killed by the dump's guard"
    );
    let o = stasis()
        .args(["restore", "--detach", "-D"])
        .arg(&images)
        .output()
        .expect("stasis restore");
    assert_ok(
        &o,
        "restore after a dumper that died halfway through its kill",
    );
    for c in &mut clients {
        assert_eq!(
            c.call(&[b"PING"]),
            b"+PONG",
            "an old connection of the restored redis"
        );
    }
    drop(admin);
    check_and_shut_down_restored(port, pid);
}

/// A restore takes the killed tree's connections over from their holder
/// one at a time, as it rebuilds each: clients whose requests were sent
/// while redis was down, and are retransmitted while the restore is still
/// rebuilding other connections, get their answers, not a reset. (Ending
/// the holder at the first connection left the others with no socket
/// until their turn; `STASIS_TEST_DELAY` stretches each turn past the
/// clients' retransmissions. Seen as a rare "backend died" of pgbench.)
#[test]
fn clients_sending_during_a_slow_restore_keep_their_connections() {
    let d = tempfile::tempdir().unwrap();
    let images = d.path().join("images");
    let (mut child, pid, port, admin, mut clients) = redis_with_clients(d.path(), 3);
    let _guard = KillOnDrop(pid);
    let o = stasis()
        .args(["dump", "-t", &pid.to_string(), "-D"])
        .arg(&images)
        .output()
        .expect("stasis dump");
    assert_ok(&o, "dump");
    let _ = child.wait();
    for c in &mut clients {
        assert!(c.send(&[b"PING"]), "a request while redis is down");
    }
    let o = stasis()
        .args(["restore", "--detach", "-D"])
        .arg(&images)
        .env("STASIS_TEST_DELAY", "tcp-reconnect:700")
        .output()
        .expect("stasis restore");
    assert_ok(&o, "restore, 0.7 s per connection");
    for (i, c) in clients.iter_mut().enumerate() {
        assert_eq!(
            c.reply(),
            b"+PONG",
            "client {i}: the reply to a request sent while redis was down"
        );
        assert_eq!(c.call(&[b"PING"]), b"+PONG", "client {i} after the restore");
    }
    drop(admin);
    check_and_shut_down_restored(port, pid);
}

/// A dump that kills the tree dies after its commit, before the kill: redis
/// runs on (the guard puts its connections back), and serves its clients
/// on their old connections.
#[test]
fn a_dumper_killed_before_the_kill_leaves_redis_running() {
    let d = tempfile::tempdir().unwrap();
    let images = d.path().join("images");
    let (mut child, pid, port, mut admin, mut clients) = redis_with_clients(d.path(), 3);
    let _guard = KillOnDrop(pid);
    let before = tcp_reuse(pid);
    dump_dying_at(pid, &images, "die-after-commit");
    // The dumper's remote syscalls took its holds by then: the guard may
    // not put the connections in repair mode again to give their send
    // windows back (redis runs), so each stays zero until the client's
    // next segment (below).
    let closed_windows = |m: BTreeMap<i32, SockState>| {
        m.into_iter()
            .map(|(fd, s)| (fd, SockState { snd_wnd: 0, ..s }))
            .collect::<BTreeMap<_, _>>()
    };
    let t0 = Instant::now();
    while closed_windows(tcp_reuse(pid)) != closed_windows(before.clone()) {
        assert!(child.try_wait().unwrap().is_none(), "redis died");
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "redis' sockets stay changed: {:?}, before {before:?}",
            tcp_reuse(pid)
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    for c in &mut clients {
        assert_eq!(c.call(&[b"PING"]), b"+PONG", "an old connection");
    }
    assert_eq!(admin.call(&[b"PING"]), b"+PONG", "the admin's connection");
    // Their segments gave every connection a send window again.
    let open = |m: &BTreeMap<i32, SockState>| m.values().all(|s| s.state != 1 || s.snd_wnd > 0);
    assert!(open(&before), "{before:?}");
    wait_until(
        Duration::from_secs(10),
        "every connection's send window open again",
        || open(&tcp_reuse(pid)),
    );
    drop(admin);
    let mut r = Redis::wait_connect(port, Some(pid));
    check_keys(&mut r);
    assert_eq!(r.call(&[b"SHUTDOWN", b"NOSAVE"]), b"-read failed");
    assert_eq!(child.wait().unwrap().code(), Some(0));
}

/// A cluster round refuses, before touching anything, a tree with a TCP
/// connection whose peer is not part of the job (here: this test, a
/// client of redis), naming the connection; redis serves on.
#[test]
fn a_cluster_dump_refuses_a_connection_to_a_peer_outside_the_job() {
    let d = tempfile::tempdir().unwrap();
    let (mut child, pid, _port, mut admin, _clients) = redis_with_clients(d.path(), 1);
    let _guard = KillOnDrop(pid);
    let tf = common::cluster::token_file(d.path(), common::cluster::TOKEN);
    let agent = common::cluster::Agent::start(&d.path().join("agent"), &tf, "127.0.0.1:0", None);
    let o = common::cluster::cluster(
        &tf,
        &[
            "dump",
            "--job",
            "r",
            "--target",
            &format!("{}={pid}", agent.addr),
        ],
    );
    assert_fails_with(&o, "outside the job's trees");
    assert_fails_with(&o, &format!("process {pid} fd"));
    assert!(child.try_wait().unwrap().is_none(), "redis died");
    check_keys(&mut admin);
    assert_eq!(admin.call(&[b"SHUTDOWN", b"NOSAVE"]), b"-read failed");
    assert_eq!(child.wait().unwrap().code(), Some(0));
}
