//! CRIU's TCP options. `--tcp-close`: established TCP
//! connections come back closed rather than rebuilt, for a process moved
//! where its peers are not. `restore --tcp-close` closes connections a
//! dump saved in full; `dump --tcp-close` saves them as closed without
//! stopping or reading them (no repair mode: the connection of a process
//! left running carries on untouched).
//!
//! The process is a Python program holding both ends of a loopback
//! connection (unread bytes queued) and a listener. Once restored and told
//! to, it reports for each end the TCP state, what a read and a write
//! give, and whether the listener still accepts.
//!
//! `dump --skip-in-flight`: a connection waiting in a listener's accept
//! queue is left out rather than refused; the restored listener has
//! nothing queued and accepts new connections.

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;

/// What both programs start with: the directory they talk through, a
/// way to wait for a file there, a listener and a connection to it.
macro_rules! prelude {
    () => {
        r#"
import json, os, socket, struct, sys, time
d = sys.argv[1]
def wait(name):
    while not os.path.exists(os.path.join(d, name)):
        time.sleep(0.02)
def publish(name, text):
    open(os.path.join(d, name + ".tmp"), "w").write(text)
    os.rename(os.path.join(d, name + ".tmp"), os.path.join(d, name))
l = socket.socket(); l.bind(("127.0.0.1", 0)); l.listen(4)
c = socket.create_connection(l.getsockname())
"#
    };
}

/// The program: makes the connection, writes its pid, then waits for
/// `go`; then writes its findings to `report` as JSON. With `check_live`,
/// it first checks the connection still carries bytes (after a dump that
/// left it running) and writes `live`.
const PROGRAM: &str = concat!(
    prelude!(),
    r#"
a, _ = l.accept()
c.sendall(b"queued")
publish("pid", str(os.getpid()))
wait("dumped")
if os.path.exists(os.path.join(d, "check_live")):
    a.sendall(b"after")
    got = c.recv(5)
    open(os.path.join(d, "live"), "w").write(got.decode())
wait("go")
out = {}
for name, s in (("client", c), ("server", a)):
    r = {"state": s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0]}
    try:
        r["recv"] = s.recv(16, socket.MSG_DONTWAIT).decode()
    except OSError as e:
        r["recv"] = "errno %d" % e.errno
    try:
        s.send(b"1", socket.MSG_DONTWAIT)
        r["send"] = "ok"
    except OSError as e:
        r["send"] = "errno %d" % e.errno
    out[name] = r
n = socket.create_connection(l.getsockname()); m, _ = l.accept()
n.sendall(b"new"); out["listener"] = m.recv(3).decode()
publish("report", json.dumps(out))
"#
);

fn start(dir: &Path, program: &str) -> (Child, i32) {
    let mut c = Command::new("python3");
    c.args(["-c", program])
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("stderr")).unwrap());
    close_inherited_fds(&mut c);
    let child = c.spawn().expect("python3");
    let pid = wait_pidfile(&dir.join("pid"), Duration::from_secs(20));
    (child, pid)
}

fn touch(dir: &Path, name: &str) {
    std::fs::write(dir.join(name), b"").unwrap();
}

/// Lets the restored program report, and checks both ends came back
/// closed (TCP_CLOSE, end of file, EPIPE) and the listener works.
fn check_closed(dir: &Path, pid: i32) {
    touch(dir, "go");
    let report = wait_json_file(&dir.join("report"), Duration::from_secs(30));
    for end in ["client", "server"] {
        let r = &report[end];
        assert_eq!(r["state"], 7, "{end} not in TCP_CLOSE: {report}");
        assert_eq!(
            r["recv"], "",
            "{end}: a read must see end of file: {report}"
        );
        assert_eq!(
            r["send"],
            format!("errno {}", libc::EPIPE),
            "{end}: a write must fail with EPIPE: {report}"
        );
    }
    assert_eq!(report["listener"], "new", "{report}");
    let (code, _) = waitpid_timeout(pid, Duration::from_secs(30));
    assert_eq!(code, Some(0), "{}", stderr_of(dir));
}

fn stderr_of(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("stderr")).unwrap_or_default()
}

fn dump(pid: i32, img: &Path, extra: &[&str]) {
    let o = stasis()
        .args(["dump", "-t", &pid.to_string(), "-D"])
        .arg(img)
        .args(extra)
        .output()
        .unwrap();
    assert_ok(&o, "stasis dump");
}

fn restore(img: &Path, extra: &[&str]) -> i32 {
    let o = stasis()
        .args(["restore", "--detach", "--json", "-D"])
        .arg(img)
        .args(extra)
        .output()
        .unwrap();
    assert_ok(&o, "stasis restore");
    i32::try_from(json(&o)["pid"].as_i64().unwrap()).unwrap()
}

#[test]
fn restore_tcp_close_brings_saved_connections_back_closed() {
    become_subreaper();
    let d = tempfile::tempdir().unwrap();
    let (mut child, pid) = start(d.path(), PROGRAM);
    let img = d.path().join("img");
    dump(pid, &img, &[]);
    child.wait().unwrap();
    touch(d.path(), "dumped");
    let restored = restore(&img, &["--tcp-close"]);
    assert_eq!(restored, pid);
    check_closed(d.path(), pid);
}

#[test]
fn dump_tcp_close_leaves_connections_untouched_and_saves_them_closed() {
    become_subreaper();
    let d = tempfile::tempdir().unwrap();
    let (mut child, pid) = start(d.path(), PROGRAM);
    let img = d.path().join("img");
    dump(pid, &img, &["--tcp-close", "--leave-running"]);
    // Not stopped, not in repair mode: the connection still carries bytes.
    touch(d.path(), "check_live");
    touch(d.path(), "dumped");
    wait_until(Duration::from_secs(30), "the live check", || {
        std::fs::read_to_string(d.path().join("live")).is_ok_and(|s| s == "after")
    });
    child.kill().unwrap();
    child.wait().unwrap();
    for f in ["live", "check_live"] {
        std::fs::remove_file(d.path().join(f)).unwrap();
    }
    let restored = restore(&img, &[]);
    assert_eq!(restored, pid);
    check_closed(d.path(), pid);
}

/// A listener with one connection waiting to be accepted, whose client
/// sent bytes already (only an accept can read them: a connection from a
/// client of the tree that sent nothing comes back, the `tcp_pending`
/// workload); once restored and told to, it reports whether anything was
/// queued and whether a new connection is accepted.
const IN_FLIGHT: &str = concat!(
    prelude!(),
    r#"
c.sendall(b"unread")
publish("pid", str(os.getpid()))
wait("go")
out = {}
l.setblocking(False)
try:
    l.accept()
    out["queued"] = "a connection"
except BlockingIOError:
    out["queued"] = "nothing"
l.setblocking(True)
n = socket.create_connection(l.getsockname()); m, _ = l.accept()
n.sendall(b"new"); out["listener"] = m.recv(3).decode()
publish("report", json.dumps(out))
"#
);

#[test]
fn dump_skip_in_flight_leaves_out_connections_not_yet_accepted() {
    become_subreaper();
    let d = tempfile::tempdir().unwrap();
    let (mut child, pid) = start(d.path(), IN_FLIGHT);
    let img = d.path().join("img");
    // Refused by default, naming the option; the process runs on.
    let o = stasis()
        .args(["dump", "-t", &pid.to_string(), "-D"])
        .arg(&img)
        .output()
        .unwrap();
    assert_fails_with(&o, "--skip-in-flight");
    assert!(alive(pid), "a refused dump killed the process");
    dump(pid, &img, &["--skip-in-flight"]);
    child.wait().unwrap();
    assert_eq!(restore(&img, &[]), pid);
    touch(d.path(), "go");
    let report = wait_json_file(&d.path().join("report"), Duration::from_secs(30));
    assert_eq!(report["queued"], "nothing", "{report}");
    assert_eq!(report["listener"], "new", "{report}");
    let (code, _) = waitpid_timeout(pid, Duration::from_secs(30));
    assert_eq!(code, Some(0), "{}", stderr_of(d.path()));
}
