//! Restores from `stasis page-server`: whole and lazy, with a wrong token,
//! with the server killed or a page cut short mid-restore (the restored
//! tree is killed, never left to read zeros), and across two network
//! namespaces joined by a veth pair.

mod common;
use common::*;

use std::time::{Duration, Instant};

const TOKEN: &str = "a-long-shared-token-for-tests-4242";

fn restore_from(addr: &str, token_file: &std::path::Path, extra: &[&str]) -> std::process::Output {
    stasis()
        .args(["restore", "--detach", "--from", addr, "--token-file"])
        .arg(token_file)
        .args(extra)
        .output()
        .unwrap()
}

/// Waits until `pid` is gone (reaping it if it is ours).
fn wait_gone(pid: i32, timeout: Duration) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < timeout {
        reap_if_ours(pid);
        if !alive(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

#[test]
fn whole_restore_from_a_page_server() {
    let mut w = Workload::start("heap", &["64"]);
    w.dump_and_reap();
    let s = PageServer::start(&w.images(), TOKEN);
    let o = restore_from(&s.addr, &s.token_file, &["--json"]);
    assert_ok(&o, "restore --from");
    let r = json(&o);
    assert_eq!(r["pid"], w.pid, "{r}");
    assert_eq!(r["lazy_bytes"], 0, "{r}");
    std::thread::sleep(Duration::from_millis(200));
    w.finish_pass();
}

/// A whole restore from a page server of files with 80 MiB of data each
/// (`big_content`: a deleted file, a memfd, a System V segment): the
/// content pack is mirrored as a pack, run by run (a `File` reply is
/// bounded), and the workload finds its content byte for byte.
#[test]
fn whole_restore_from_a_page_server_of_big_files() {
    let mut w = Workload::start("big_content", &[]);
    w.dump_and_reap();
    let s = PageServer::start(&w.images(), TOKEN);
    let o = restore_from(&s.addr, &s.token_file, &["--json"]);
    assert_ok(&o, "restore --from");
    assert_eq!(json(&o)["pid"], w.pid);
    std::thread::sleep(Duration::from_millis(200));
    w.finish_pass();
}

#[test]
fn wrong_or_missing_token_is_refused_and_nothing_runs() {
    let mut w = Workload::start("heap", &["16"]);
    w.dump_and_reap();
    let s = PageServer::start(&w.images(), TOKEN);
    let bad = w.dir.path().join("bad-token");
    std::fs::write(&bad, "not-the-token-at-all-000000").unwrap();
    for lazy in [false, true] {
        let extra: &[&str] = if lazy { &["--lazy"] } else { &[] };
        let o = restore_from(&s.addr, &bad, extra);
        assert_fails_with(&o, "refused the token");
        assert!(!alive(w.pid), "a process runs after a refused restore");
    }
    let o = stasis()
        .args(["restore", "--detach", "--from", &s.addr])
        .output()
        .unwrap();
    assert_fails_with(&o, "--token-file");
    // The right token still works.
    let o = restore_from(&s.addr, &s.token_file, &["--lazy"]);
    assert_ok(&o, "restore --lazy --from");
    std::thread::sleep(Duration::from_millis(200));
    w.finish_pass();
}

/// The server goes away while pages stream in: the filler cannot deliver
/// the pages still owed, so it kills the tree and says why.
#[test]
fn server_killed_mid_restore_kills_the_tree() {
    let mut w = Workload::start("heap", &["256"]);
    w.dump_and_reap();
    let mut s = PageServer::start(&w.images(), TOKEN);
    // 256 MiB at 16 MiB/s per connection: the fill takes seconds.
    let p = Proxy::start(&s.addr, Some(16 << 20), None);
    let stats = w.dir.path().join("stats.json");
    let log = w.dir.path().join("filler.log");
    let o = restore_from(
        &p.addr,
        &s.token_file,
        &[
            "--lazy",
            "--lazy-stats",
            stats.to_str().unwrap(),
            "--lazy-log",
            log.to_str().unwrap(),
        ],
    );
    assert_ok(&o, "restore --lazy --from");
    assert!(alive(w.pid));
    std::thread::sleep(Duration::from_millis(300));
    s.kill();
    drop(p);
    assert!(
        wait_gone(w.pid, Duration::from_secs(60)),
        "the tree outlived its page server"
    );
    let st = wait_json_file(&stats, Duration::from_secs(60));
    let err = st["error"]
        .as_str()
        .unwrap_or_else(|| panic!("no error: {st}"));
    assert!(
        err.contains("was killed") && err.contains(&w.pid.to_string()),
        "{err}"
    );
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("reading zeros"), "{text}");
}

/// A reply cut in the middle of a page: the client sees it short, the tree
/// is killed.
#[test]
fn truncated_page_kills_the_tree() {
    let mut w = Workload::start("heap", &["128"]);
    w.dump_and_reap();
    let s = PageServer::start(&w.images(), TOKEN);
    // Every connection is cut 1000 bytes into its fourth MiB: the small
    // fetches before the tree runs get through, the filler's do not.
    let p = Proxy::start(&s.addr, None, Some((3 << 20) + 1000));
    let stats = w.dir.path().join("stats.json");
    let o = restore_from(
        &p.addr,
        &s.token_file,
        &["--lazy", "--lazy-stats", stats.to_str().unwrap()],
    );
    // The background stream starts with the first process handed to the
    // filler, and its connection is cut after 3 MiB: usually after the
    // restore has returned, but on a busy machine before it could say the
    // tree runs; then the restore fails, with the filler's reason.
    if !o.status.success() {
        assert_fails_with(
            &o,
            "was killed, since running on would have meant reading zeros",
        );
    }
    assert!(
        wait_gone(w.pid, Duration::from_secs(60)),
        "the tree survived a truncated page"
    );
    let st = wait_json_file(&stats, Duration::from_secs(60));
    assert!(
        st["error"]
            .as_str()
            .is_some_and(|e| e.contains("was killed")),
        "{st}"
    );
    assert!(p.cuts.load(std::sync::atomic::Ordering::Relaxed) >= 1);
}

fn ip(args: &[&str]) {
    let o = std::process::Command::new("ip")
        .args(args)
        .output()
        .unwrap();
    assert_ok(&o, &format!("ip {}", args.join(" ")));
}

/// Deletes the namespaces when dropped.
struct Netns(&'static [&'static str]);
impl Drop for Netns {
    fn drop(&mut self) {
        for n in self.0 {
            let _ = std::process::Command::new("ip")
                .args(["netns", "del", n])
                .output();
        }
    }
}

/// Two hosts: the page server in one network namespace, the restore in
/// another, joined by a veth pair.
#[test]
fn lazy_restore_across_network_namespaces() {
    let (a, b) = ("stasis-test-srv", "stasis-test-cli");
    let _ = std::process::Command::new("ip")
        .args(["netns", "del", a])
        .output();
    let _ = std::process::Command::new("ip")
        .args(["netns", "del", b])
        .output();
    let _ns = Netns(&["stasis-test-srv", "stasis-test-cli"]);
    ip(&["netns", "add", a]);
    ip(&["netns", "add", b]);
    ip(&[
        "link", "add", "stv-a", "netns", a, "type", "veth", "peer", "name", "stv-b", "netns", b,
    ]);
    ip(&["-n", a, "addr", "add", "10.77.0.1/24", "dev", "stv-a"]);
    ip(&["-n", b, "addr", "add", "10.77.0.2/24", "dev", "stv-b"]);
    for (ns, dev) in [(a, "stv-a"), (b, "stv-b")] {
        ip(&["-n", ns, "link", "set", dev, "up"]);
        ip(&["-n", ns, "link", "set", "lo", "up"]);
    }
    let mut w = Workload::start("heap", &["64"]);
    w.dump_and_reap();
    let s = PageServer::start_on(&w.images(), TOKEN, "10.77.0.1:0", Some(a));
    assert!(s.addr.starts_with("10.77.0.1:"), "{}", s.addr);
    let stats = w.dir.path().join("stats.json");
    let o = std::process::Command::new("ip")
        .args(["netns", "exec", b])
        .arg(env!("CARGO_BIN_EXE_stasis"))
        .args([
            "restore",
            "--detach",
            "--lazy",
            "--from",
            &s.addr,
            "--lazy-stats",
        ])
        .arg(&stats)
        .arg("--token-file")
        .arg(&s.token_file)
        .output()
        .unwrap();
    assert_ok(&o, "restore --lazy --from another namespace");
    // The restored process lives in namespace b, pages came from a.
    let ns_of = |pid: i32| std::fs::read_link(format!("/proc/{pid}/ns/net")).unwrap();
    let st = wait_json_file(&stats, Duration::from_secs(60));
    assert!(st.get("error").is_none(), "{st}");
    assert!(
        st["pages_streamed"].as_u64().unwrap() + st["pages_by_fault"].as_u64().unwrap() > 0,
        "{st}"
    );
    assert_ne!(ns_of(w.pid), ns_of(std::process::id() as i32));
    w.finish_pass();
}

/// `stasis page-server` with extra flags (e.g. `--insecure-plaintext`),
/// killed when dropped.
struct Served {
    child: std::process::Child,
    addr: String,
}

impl Served {
    fn start(dir: &std::path::Path, token_file: &std::path::Path, extra: &[&str]) -> Served {
        use std::io::BufRead;
        let mut child = stasis()
            .args([
                "page-server",
                "--json",
                "--listen",
                "127.0.0.1:0",
                "--token-file",
            ])
            .arg(token_file)
            .arg("-D")
            .arg(dir)
            .args(extra)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["tls"], extra.is_empty(), "{v}");
        Served {
            child,
            addr: v["listening"].as_str().unwrap().to_string(),
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A relay in front of a server that records every byte, both ways, of
/// every connection through it.
struct Relay {
    addr: String,
    seen: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Relay {
    fn start(upstream: &str) -> Relay {
        use std::io::{Read, Write};
        use std::net::{Shutdown, TcpListener, TcpStream};
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::{Arc, Mutex};
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (st, rec, up) = (stop.clone(), seen.clone(), upstream.to_string());
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
                let pipe = |mut from: TcpStream, mut to: TcpStream, rec: Arc<Mutex<Vec<u8>>>| {
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 65536];
                        while let Ok(n) = from.read(&mut buf) {
                            rec.lock().unwrap().extend_from_slice(&buf[..n]);
                            if n == 0 || to.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                        let _ = to.shutdown(Shutdown::Write);
                    });
                };
                pipe(
                    client.try_clone().unwrap(),
                    server.try_clone().unwrap(),
                    rec.clone(),
                );
                pipe(server, client, rec.clone());
            }
        });
        Relay { addr, seen, stop }
    }

    fn bytes(&self) -> Vec<u8> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

fn token_file_in(dir: &std::path::Path) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join("token");
    std::fs::write(&p, TOKEN).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    p
}

/// Encryption in transit: a whole and a lazy restore through a relay that
/// records every byte. Over TLS (the default) no sample of the process's
/// memory crosses it; with `--insecure-plaintext` on both ends (the
/// control, so the check can fail) they do. The process passes after each.
#[test]
fn tls_keeps_process_memory_off_the_wire() {
    let mut w = Workload::start("heap", &["16"]);
    std::thread::sleep(Duration::from_millis(200));
    let samples = memory_samples(w.pid);
    w.dump_and_reap();
    let token = token_file_in(w.dir.path());
    for (flags, lazy) in [
        (&["--insecure-plaintext"][..], false),
        (&[][..], false),
        (&[][..], true),
    ] {
        let s = Served::start(&w.images(), &token, flags);
        let relay = Relay::start(&s.addr);
        let stats = w.dir.path().join(format!("stats-{lazy}.json"));
        let mut extra = flags.to_vec();
        if lazy {
            extra.extend(["--lazy", "--lazy-stats", stats.to_str().unwrap()]);
        }
        let o = restore_from(&relay.addr, &token, &extra);
        assert_ok(&o, &format!("restore --from {extra:?}"));
        assert!(alive(w.pid));
        if lazy {
            // The filler streams the rest in the background: wait for it.
            let st = wait_json_file(&stats, Duration::from_secs(60));
            assert!(st.get("error").is_none(), "{st}");
        }
        let wire = relay.bytes();
        let leaked = wire
            .windows(32)
            .filter(|x| samples.contains(<&[u8; 32]>::try_from(*x).unwrap()))
            .count();
        eprintln!(
            "{extra:?}: {} bytes crossed, {leaked} samples seen",
            wire.len()
        );
        assert!(wire.len() > 8 << 20, "{extra:?}: {} bytes", wire.len());
        assert_eq!(
            leaked > 0,
            !flags.is_empty(),
            "{extra:?}: {leaked} samples on the wire"
        );
        if lazy {
            w.finish_pass();
        } else {
            kill_and_reap(&mut w);
        }
    }
}

/// A plaintext restore from a TLS server, and a TLS restore from a
/// plaintext server, are refused with a message naming the flag, and
/// nothing runs.
#[test]
fn tls_and_plaintext_ends_refuse_each_other() {
    let mut w = Workload::start("heap", &["16"]);
    w.dump_and_reap();
    let token = token_file_in(w.dir.path());
    let plain = &["--insecure-plaintext"][..];
    for (server, client) in [(&[][..], plain), (plain, &[][..])] {
        let s = Served::start(&w.images(), &token, server);
        let o = restore_from(&s.addr, &token, client);
        assert_fails_with(&o, "--insecure-plaintext");
        assert!(!alive(w.pid), "a process runs after a refused restore");
    }
}

/// Whether a thread of process `pid` is blocked in system call `nr`
/// (`/proc/PID/task/TID/syscall` starts with its number).
fn a_thread_in_syscall(pid: i32, nr: i64) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().any(|t| {
        std::fs::read_to_string(t.path().join("syscall"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<i64>().ok())
            == Some(nr)
    })
}

/// The state letter of `/proc/PID/stat` (`T`: stopped), or `?`.
fn state_of(pid: i32) -> char {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit(')').next()?.trim_start().chars().next())
        .unwrap_or('?')
}

/// A page server stopped and continued (SIGSTOP/SIGCONT: job control, a
/// debugger attaching, a freezer) while a client has connected but not
/// yet sent its TLS hello still serves that client. Its wait for the
/// hello (a `recv` with a timeout, which the kernel does not restart after
/// a stop) ended in EINTR and it closed the connection: the client saw
/// "the peer closed the connection during the TLS handshake", as the lazy
/// restore of the unix_scm workload did in an idle CI run.
#[test]
fn a_page_server_stopped_and_continued_keeps_a_client_that_has_not_said_hello() {
    use stasis_pageserver::protocol;
    use stasis_pageserver::tls::{self, ClientTls, Purpose};
    use std::io::Write;
    let mut w = Workload::start("counter", &[]);
    w.dump_and_reap();
    let s = PageServer::start(&w.images(), TOKEN);
    let pid = i32::try_from(s.pid()).unwrap();
    let tcp = std::net::TcpStream::connect(&s.addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    tcp.set_write_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    // The server has accepted the connection and waits for the hello.
    wait_until(
        Duration::from_secs(30),
        "a page server thread waiting in recvfrom",
        || a_thread_in_syscall(pid, libc::SYS_recvfrom),
    );
    // SAFETY: stopping and continuing the page server this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    wait_until(Duration::from_secs(30), "the page server stopped", || {
        state_of(pid) == 'T'
    });
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
    wait_until(Duration::from_secs(30), "the page server continued", || {
        state_of(pid) != 'T'
    });
    let config = ClientTls::new(TOKEN.as_bytes(), Purpose::PageServer).unwrap();
    let mut stream = tls::connect(tcp, &config).unwrap_or_else(|e| {
        panic!(
            "TLS with the page server after its stop: {e}; it logged:\n{}",
            s.log_text()
        )
    });
    // And the protocol goes on: the server answers the greeting.
    protocol::write_greeting(&mut stream, protocol::PROTOCOL_VERSION).unwrap();
    stream.flush().unwrap();
    let theirs = protocol::read_greeting(&mut stream).unwrap();
    assert_eq!(theirs, Some(protocol::PROTOCOL_VERSION));
    // A whole restore from it works as well.
    drop(stream);
    let o = restore_from(&s.addr, &s.token_file, &[]);
    assert_ok(
        &o,
        &format!("restore --from; the server logged:\n{}", s.log_text()),
    );
    w.finish_pass();
}
