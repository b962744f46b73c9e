//! Pseudo-terminal pairs (`stasis_objects::pty`): the `pty` workload (a
//! canonical pair that is a child's controlling terminal, which it also
//! holds as `/dev/tty`, a raw packet-mode pair, bytes queued both ways in
//! both, a third pair that is the terminal of a session leader holding no
//! fd of it) dumped and restored, left
//! running, dumped concurrently; and the ptys stasis refuses, with the
//! process left running untouched.

mod common;
use common::*;

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::Stdio;
use std::time::Duration;

/// The `pty` workload's tree is up: the root, its child C (a session
/// leader, its terminal P1's slave) and C's child G (the terminal's
/// foreground group), and its child D (a session leader whose terminal,
/// P3's slave, it holds no fd of).
fn start() -> Workload {
    let w = Workload::start("pty", &[]);
    let kids = descendants(w.pid);
    assert_eq!(kids.len(), 3, "pty: root, C, G and D, got {kids:?}");
    w
}

/// What `stasis inspect -c 1` says of the workload's image.
fn inspect(w: &Workload) -> String {
    let o = stasis()
        .args(["inspect", "--checkpoint", "1", "-D"])
        .arg(w.images())
        .output()
        .unwrap();
    assert_ok(&o, "inspect");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn pty_pairs_survive_dump_and_restore_twice() {
    let mut w = start();
    for round in 1..=2 {
        w.dump_and_reap();
        assert!(!alive(w.pid), "round {round}: still alive after the dump");
        w.restore(&[]);
        assert_eq!(
            descendants(w.pid).len(),
            3,
            "round {round}: C, G and D restored"
        );
    }
    let text = inspect(&w);
    assert_eq!(text.matches("pty master").count(), 3, "{text}");
    assert!(text.contains("pty slave"), "{text}");
    assert!(text.contains("/dev/tty (pts"), "{text}");
    // Every byte queued at the dump: P1's three lines, its partial line
    // and its 3000 raw bytes to the slaves; C's hello with the echo of
    // P1's input, and P2's 2000 bytes to the masters.
    assert!(
        text.contains("3000 bytes queued to the slave, 2000 to the master"),
        "{text}"
    );
    w.finish_pass();
}

fn leave_running_with(flags: &[&str]) {
    let mut w = start();
    let mut args = vec!["--leave-running"];
    args.extend_from_slice(flags);
    let o = w.dump(&args);
    assert_ok(&o, "dump --leave-running");
    assert!(alive(w.pid), "--leave-running killed the root");
    // The tree runs on with every queued byte where it was...
    w.finish_pass();
    // ...and the image of the instant of the dump restores as well.
    std::fs::write(w.dir.path().join("out.log"), b"").unwrap();
    w.restore(&[]);
    w.finish_pass();
}

#[test]
fn pty_pairs_left_running_keep_their_bytes_and_restore() {
    leave_running_with(&[]);
}

#[test]
fn pty_pairs_dumped_concurrently() {
    leave_running_with(&["--concurrent"]);
}

/// Fork snapshots share their process's fd table and session: they must
/// not count as holders of its ptys outside the tree.
#[test]
fn pty_pairs_dumped_concurrently_by_fork_snapshots() {
    leave_running_with(&["--concurrent", "--cow-method", "fork"]);
}

/// A new pair of this test process: (master, slave).
fn open_pair() -> (OwnedFd, OwnedFd) {
    let m: OwnedFd = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/ptmx")
        .unwrap()
        .into();
    let unlock: libc::c_int = 0;
    // SAFETY: TIOCSPTLCK reads an int; TIOCGPTPEER returns a new fd.
    let s = unsafe {
        assert_eq!(
            libc::ioctl(m.as_raw_fd(), libc::TIOCSPTLCK, &raw const unlock),
            0
        );
        libc::ioctl(
            m.as_raw_fd(),
            libc::TIOCGPTPEER,
            libc::O_RDWR | libc::O_NOCTTY,
        )
    };
    assert!(s >= 0, "TIOCGPTPEER");
    // SAFETY: a new descriptor, owned by nobody else.
    (m, unsafe { OwnedFd::from_raw_fd(s) })
}

/// `sleep 100` with `stdin` as its stdin; the dump of it must fail naming
/// `needle`, and leave it running, untraced.
fn refused(stdin: OwnedFd, needle: &str) {
    let d = tempfile::tempdir().unwrap();
    let mut c = std::process::Command::new("sleep");
    c.arg("100")
        .stdin(Stdio::from(stdin))
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    close_inherited_fds(&mut c);
    let mut child = c.spawn().unwrap();
    let pid = child.id() as i32;
    let _guard = KillOnDrop(pid);
    wait_until(Duration::from_secs(10), "sleep to exec", || {
        comm_of(pid) == "sleep"
    });
    let o = stasis()
        .args(["dump", "-t", &pid.to_string(), "-D"])
        .arg(d.path().join("img"))
        .output()
        .unwrap();
    assert_fails_with(&o, needle);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains(&format!("process {pid}")), "{err}");
    assert!(err.contains("fd 0") || err.contains("pty"), "{err}");
    assert!(alive(pid), "the refused process must keep running");
    let stat = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    assert!(stat.contains("TracerPid:\t0"), "left traced: {stat}");
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn a_slave_whose_master_is_outside_the_tree_is_refused() {
    let (_master, slave) = open_pair();
    refused(slave, "whose master is not held by the dumped tree");
}

#[test]
fn a_master_whose_slave_is_outside_the_tree_is_refused_and_keeps_its_bytes() {
    let (master, slave) = open_pair();
    // Queued for the master (which sleep holds and never reads): the dump
    // reads it and must put it back.
    let n = nix_write(&slave, b"kept\n");
    assert_eq!(n, 5);
    let m = master.as_raw_fd();
    // SAFETY: dup of our own fd.
    let copy = unsafe { OwnedFd::from_raw_fd(libc::dup(m)) };
    refused(master, "is also held by process");
    // The bytes are still queued, in order (the slave's ONLCR made "\r\n").
    let mut buf = [0u8; 16];
    // SAFETY: reading into a local buffer.
    let got = unsafe { libc::read(copy.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
    assert_eq!(&buf[..usize::try_from(got).unwrap()], b"kept\r\n");
}

fn nix_write(fd: &OwnedFd, data: &[u8]) -> isize {
    // SAFETY: writing a local buffer to our own fd.
    unsafe { libc::write(fd.as_raw_fd(), data.as_ptr().cast(), data.len()) }
}

#[test]
fn pty_pairs_restore_lazily() {
    let mut w = start();
    w.dump_and_reap();
    let stats = w.dir.path().join("lazy-stats.json");
    w.restore(&["--lazy", "--lazy-stats", stats.to_str().unwrap()]);
    let s = wait_json_file(&stats, Duration::from_secs(60));
    assert!(s.get("error").is_none(), "filler failed: {s}");
    w.finish_pass();
}

#[test]
fn a_master_whose_slave_was_never_opened_is_refused() {
    let m: OwnedFd = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/ptmx")
        .unwrap()
        .into();
    // Only sleep holds the pair, and nobody ever opened its slave: opening
    // one to read its queue would leave the master hung up once closed.
    refused(m, "has never been opened");
}
