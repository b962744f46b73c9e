//! The dump guard: a process of its own that outlives a killed dumper and
//! reaps what its fork snapshots left behind.
//!
//! A fork snapshot ([`crate::snapshot`]) is a child of the dumped process,
//! created with an exit signal of 0 and `PTRACE_O_EXITKILL`. If the dumper
//! dies while the tree runs on (during a concurrent copy), the kernel kills
//! the snapshot, and its zombie stays a child of the process, which never
//! reaps it (a plain `wait` does not see it), until the process exits. Only
//! the parent can reap a child, so the guard, told of each snapshot as it
//! is made and as it is reaped, does what the dumper would have: once its
//! line to the dumper closes without `done`, it stops each parent briefly
//! and has it `wait4` for its snapshot by a remote syscall (through the
//! escape hatch, so a guard killed meanwhile harms nothing either).
//!
//! It runs in a process group of its own (one signal to the dumper's group
//! does not take both), started before the freeze of a dump that will
//! fork snapshots ([`start`]: its start, an exec of stasis, costs a few
//! milliseconds of CPU that would otherwise compete with the frozen tree),
//! or else with the first snapshot, and exits after `done` (or, idle, when
//! the dumper exits). Lines on its stdin: `snap PARENT CHILD`, `reaped PARENT
//! CHILD`, `done`.

use std::io::{BufRead, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::Result;

struct Line {
    child: Child,
    stdin: ChildStdin,
    open: usize,
}

static GUARD: Mutex<Option<Line>> = Mutex::new(None);

fn say(l: &mut Line, what: &str) -> bool {
    l.stdin
        .write_all(what.as_bytes())
        .and_then(|()| l.stdin.flush())
        .is_ok()
}

/// Starts the guard now, if none runs, for the snapshots of a dump about
/// to freeze its tree.
pub fn start() {
    let mut g = GUARD.lock().unwrap_or_else(|e| e.into_inner());
    ensure(&mut g);
}

/// Starts the guard if none runs. Best effort: without a guard (no
/// `stasis` binary to run, say) a killed dumper leaves the zombie, as it
/// did before guards existed.
fn ensure(g: &mut Option<Line>) {
    if g.is_none() {
        let spawned = Command::new(stasis_kernel::launch::own_exe())
            .arg("__dump-guard")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn();
        match spawned {
            Ok(mut child) => match child.stdin.take() {
                Some(stdin) => {
                    *g = Some(Line {
                        child,
                        stdin,
                        open: 0,
                    })
                }
                None => tracing::warn!("the dump guard has no stdin"),
            },
            Err(e) => tracing::warn!("cannot start the dump guard: {e}"),
        }
    }
}

/// Tells the guard (started now if need be) of a new snapshot.
pub fn snapshot_made(parent: i32, child: i32) {
    let mut g = GUARD.lock().unwrap_or_else(|e| e.into_inner());
    ensure(&mut g);
    if let Some(l) = g.as_mut() {
        if say(l, &format!("snap {parent} {child}\n")) {
            l.open += 1;
        }
    }
}

/// Tells the guard a snapshot was reaped; with none left, lets it go.
pub fn snapshot_reaped(parent: i32, child: i32) {
    let mut g = GUARD.lock().unwrap_or_else(|e| e.into_inner());
    let Some(l) = g.as_mut() else { return };
    if say(l, &format!("reaped {parent} {child}\n")) {
        l.open = l.open.saturating_sub(1);
    }
    if l.open == 0 {
        let mut l = g.take().expect("checked above");
        let _ = say(&mut l, "done\n");
        drop(l.stdin);
        let _ = l.child.wait();
    }
}

/// The guard's main loop (`stasis __dump-guard`): returns the snapshots it
/// had to reap (parent, child).
pub fn run(input: impl BufRead) -> Result<Vec<(i32, i32)>> {
    let mut open: Vec<(i32, i32)> = Vec::new();
    for line in input.lines() {
        let Ok(line) = line else { break };
        let mut w = line.split_whitespace();
        let (verb, p, c) = (w.next(), w.next(), w.next());
        let pair = p
            .and_then(|p| p.parse().ok())
            .zip(c.and_then(|c| c.parse().ok()));
        match (verb, pair) {
            (Some("done"), _) => return Ok(Vec::new()),
            (Some("snap"), Some(pc)) => open.push(pc),
            (Some("reaped"), Some(pc)) => open.retain(|&x| x != pc),
            _ => {}
        }
    }
    // The dumper is gone without `done`: its snapshots were killed with it
    // (or are being killed); reap each in its parent.
    let mut reaped = Vec::new();
    for (parent, child) in open {
        let t0 = Instant::now();
        while !dead(child) && t0.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(5));
        }
        // The dumper's pipe closes before the kernel detaches its tracees
        // (a process's files go before its ptrace links): a freeze now
        // would fail to seize the parent, and leave the snapshot unreaped.
        let t0 = Instant::now();
        while traced(parent) && t0.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(5));
        }
        // The parent may be running its own escape code (which reaps the
        // snapshot itself): wait for it to finish.
        let t0 = Instant::now();
        loop {
            match crate::snapshot::reap(parent, &[(parent, child)]) {
                Ok(_) => {
                    reaped.push((parent, child));
                    break;
                }
                Err(crate::CaptureError::Escaping { .. })
                    if t0.elapsed() < Duration::from_secs(10) =>
                {
                    std::thread::sleep(Duration::from_millis(5));
                }
                // Already reaped (by the escape code), or the parent is gone.
                Err(_) => break,
            }
        }
    }
    Ok(reaped)
}

/// Whether a thread of `pid` is still traced (by the dumper being torn
/// down). Any thread: the dumper seizes them all.
fn traced(pid: i32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().any(|t| {
        std::fs::read_to_string(t.path().join("status")).is_ok_and(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("TracerPid:"))
                .is_some_and(|v| v.trim() != "0")
        })
    })
}

/// A zombie, or gone.
fn dead(pid: i32) -> bool {
    stasis_kernel::procfs::gone_or_zombie(pid)
}
