//! Shell jobs (`dump --shell-job`, `restore --shell-job`): a program run
//! from an interactive shell, its fds 0-2 on the shell's terminal (a pts
//! whose master is outside the tree), in the foreground with its own
//! terminal settings. Dumped, then restored from another "shell" on
//! another terminal: it reads from and writes to that terminal, in the
//! foreground, with the settings it had, its memory intact.
//!
//! The terminals are real pseudo-terminals whose masters this test holds
//! (as a terminal emulator would); the shells are small Python programs
//! that lead a session on a slave and run a job in the foreground the way
//! shells do.

mod common;
use common::*;

use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The job: cbreak mode (no echo, no canonical lines) on its terminal,
/// then a loop answering each line it reads: "ping" with its count of
/// pings (kept in memory across the checkpoint) and what it sees of its
/// terminal; "quit" ends it.
const JOB: &str = r#"
import os, sys, termios, tty
tty.setcbreak(0)
open(sys.argv[1] + '.tmp', 'w').write(str(os.getpid()))
os.rename(sys.argv[1] + '.tmp', sys.argv[1])
pings = 0
line = b''
while True:
    c = os.read(0, 1)
    if not c:
        break
    if c != b'\n':
        line += c
        continue
    if line == b'quit':
        break
    if line == b'ping':
        pings += 1
        a = termios.tcgetattr(0)
        checks = {
            'tty': all(os.isatty(n) for n in (0, 1, 2)),
            'fg': os.tcgetpgrp(0) == os.getpgrp(),
            'cbreak': not (a[3] & (termios.ECHO | termios.ICANON)),
            'name': os.ttyname(0) == os.readlink('/proc/self/fd/0'),
            'ctty': int(open('/proc/self/stat').read().rsplit(')', 1)[1].split()[4]) != 0,
        }
        bad = [k for k, v in checks.items() if not v]
        os.write(1, ('pong %d %s\n' % (pings, ','.join(bad) or 'ok')).encode())
    line = b''
"#;

/// A shell: leads a session on the terminal `argv[1]` (its controlling
/// terminal), runs `argv[2:]` as a job in a process group of its own in
/// the foreground, waits for it and exits with its status.
const SHELL: &str = r#"
import os, signal, sys
os.setsid()
t = os.open(sys.argv[1], os.O_RDWR)
pid = os.fork()
if pid == 0:
    os.setpgid(0, 0)
    signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    os.tcsetpgrp(t, os.getpid())
    signal.signal(signal.SIGTTOU, signal.SIG_DFL)
    for n in (0, 1, 2):
        os.dup2(t, n)
    os.closerange(3, 1024)
    os.execvp(sys.argv[2], sys.argv[2:])
os.setpgid(pid, pid)
_, st = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(st) & 0xff)
"#;

/// A terminal: the master (ours) and the slave's path.
struct Terminal {
    master: std::fs::File,
    slave: String,
    _slave: OwnedFd,
}

fn terminal() -> Terminal {
    let p = nix::pty::openpty(None, None).unwrap();
    let slave = std::fs::read_link(format!("/proc/self/fd/{}", {
        use std::os::fd::AsRawFd;
        p.slave.as_raw_fd()
    }))
    .unwrap()
    .to_string_lossy()
    .into_owned();
    Terminal {
        master: std::fs::File::from(p.master),
        slave,
        _slave: p.slave,
    }
}

impl Terminal {
    /// Everything the terminal shows until `needle` appears (60 s at most).
    fn read_until(&mut self, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut seen = Vec::new();
        while Instant::now() < deadline {
            let mut fds = [nix::poll::PollFd::new(
                self.master.as_fd(),
                nix::poll::PollFlags::POLLIN,
            )];
            if nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(100u16)).unwrap_or(0) > 0 {
                let mut b = [0u8; 4096];
                match self.master.read(&mut b) {
                    Ok(n) if n > 0 => seen.extend_from_slice(&b[..n]),
                    _ => break,
                }
            }
            let text = String::from_utf8_lossy(&seen);
            if text.contains(needle) {
                return text.into_owned();
            }
        }
        let ps = Command::new("ps")
            .args(["-eo", "pid,ppid,pgid,sid,tty,stat,wchan:20,cmd"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        panic!(
            "the terminal never showed {needle:?}; it showed {:?}\n{}",
            String::from_utf8_lossy(&seen),
            ps.lines()
                .filter(|l| l.contains("python3") || l.contains("stasis"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }

    fn type_line(&mut self, line: &str) {
        self.master.write_all(line.as_bytes()).unwrap();
        self.master.write_all(b"\n").unwrap();
    }
}

fn shell(t: &Terminal, argv: &[&str]) -> Child {
    let mut c = Command::new("python3");
    c.arg("-c")
        .arg(SHELL)
        .arg(&t.slave)
        .args(argv)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    close_inherited_fds(&mut c);
    c.spawn().unwrap()
}

fn wait_exit(c: &mut Child, what: &str) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(st) = c.try_wait().unwrap() {
            return st.code().unwrap_or(-1);
        }
        assert!(Instant::now() < deadline, "{what} did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_shell_job_comes_back_on_the_terminal_of_the_restore() {
    let d = tempfile::tempdir().unwrap();
    let pidfile = d.path().join("job.pid");
    let img = d.path().join("img");
    let job_py = d.path().join("job.py");
    std::fs::write(&job_py, JOB).unwrap();

    // The job, in the foreground of a shell on terminal A.
    let mut a = terminal();
    let mut sh = shell(
        &a,
        &[
            "python3",
            job_py.to_str().unwrap(),
            pidfile.to_str().unwrap(),
        ],
    );
    let pid = wait_pidfile(&pidfile, Duration::from_secs(20));
    a.type_line("ping");
    assert!(a.read_until("pong 1").contains("pong 1 ok"));

    // Without --shell-job: refused, the job runs on.
    let o = stasis()
        .args(["dump", "-t", &pid.to_string(), "-D"])
        .arg(&img)
        .output()
        .unwrap();
    assert_fails_with(&o, "--shell-job");
    assert!(alive(pid));

    let o = stasis()
        .args(["dump", "--shell-job", "-t", &pid.to_string(), "-D"])
        .arg(&img)
        .output()
        .unwrap();
    assert_ok(&o, "dump --shell-job");
    // (Its job killed by the dump: -SIGKILL, as a byte.)
    assert_eq!(wait_exit(&mut sh, "the first shell"), 247);
    let o = stasis()
        .args(["inspect", "--checkpoint", "1", "-D"])
        .arg(&img)
        .output()
        .unwrap();
    assert_ok(&o, "inspect");
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        text.matches("the shell job's terminal").count(),
        3,
        "{text}"
    );

    // Restores that cannot put it anywhere: refused, nothing started.
    let o = stasis().args(["restore", "-D"]).arg(&img).output().unwrap();
    assert_fails_with(&o, "--shell-job");
    let o = Command::new("setsid")
        .arg("-w")
        .arg(env!("CARGO_BIN_EXE_stasis"))
        .args(["restore", "--shell-job", "-D"])
        .arg(&img)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_fails_with(&o, "no controlling terminal");
    assert!(!alive(pid), "a refused restore started the job");

    // From a shell on terminal B: the job there, in the foreground, as it
    // was (cbreak), its second ping counted after the first.
    let mut b = terminal();
    let mut restorer = shell(
        &b,
        &[
            env!("CARGO_BIN_EXE_stasis"),
            "restore",
            "--shell-job",
            "-D",
            img.to_str().unwrap(),
        ],
    );
    // What the user sees once the job runs.
    let restored = b.read_until(&format!("restored pid {pid}"));
    b.type_line("ping");
    let shown = restored + &b.read_until("pong 2");
    assert!(shown.contains("pong 2 ok"), "{shown}");
    b.type_line("quit");
    assert_eq!(wait_exit(&mut restorer, "the restoring shell"), 0);
}
