//! Fault injection for tests (CRIU's `CRIU_FAULT` in spirit).
//!
//! Not kernel ABI: this is the one test hook, kept in the lowest crate so
//! that every crate can reach it. `STASIS_FAULT=POINT:N` makes the `N`th
//! pass (counting from 1) through the named point fail, once, as if the
//! operation had failed with `EIO`. Points: `remote-syscall` (every
//! injected syscall), `image-write` (every write to an image file), and
//! `die-in-remote-syscall`, which is not an error but a death: the process
//! SIGKILLs itself at the `N`th step of its remote syscalls (each has four:
//! registers set, signals blocked, entry stop, exit stop), so a test can
//! kill a dumper at every instant of an injection; `die-after-commit` and
//! `die-after-kill`, deaths of a dump that kills the tree, between its
//! commit and its kill, and halfway through the kill;
//! `die-in-cluster-round`, the cluster coordinator after the Nth message it
//! sends every agent in a round; `die-after-decision`, a cluster agent
//! between recording a round's decision and committing; `die-in-tcp-repair`,
//! a dump at each step of reading its TCP connections; `die-in-release`, a
//! restore after it let go of its Nth process. Unset, a check is one
//! `OnceLock` read.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// Named points where a fault can be injected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Point {
    /// Every remote (injected) syscall.
    RemoteSyscall,
    /// Every write of image data.
    ImageWrite,
    /// Every step of a remote syscall (see [`die_at`]).
    DieInRemoteSyscall,
    /// A dump that kills the tree: its checkpoint committed, nothing
    /// killed yet.
    DieAfterCommit,
    /// A dump that kills the tree: the owners of its TCP connections
    /// killed (by the socket guard), the rest of the tree not yet.
    DieAfterKill,
    /// The cluster coordinator, after each message of a round it sends to
    /// every agent (1: `Dump`, 2: `Freeze`, 3: `Release`, 4: `Commit`).
    DieInClusterRound,
    /// A cluster agent, right after recording a round's decision, before
    /// any commit.
    DieAfterDecision,
    /// A dump reading its TCP connections: 1 their owners held, none in
    /// repair mode yet; 2 all in repair mode; 3 all read; 4 all out of
    /// repair mode again, still locked.
    DieInTcpRepair,
    /// A restore letting its tree go, after the Nth process let go (the
    /// root last).
    DieInRelease,
}

impl Point {
    fn name(self) -> &'static str {
        match self {
            Point::RemoteSyscall => "remote-syscall",
            Point::ImageWrite => "image-write",
            Point::DieInRemoteSyscall => "die-in-remote-syscall",
            Point::DieAfterCommit => "die-after-commit",
            Point::DieAfterKill => "die-after-kill",
            Point::DieInClusterRound => "die-in-cluster-round",
            Point::DieAfterDecision => "die-after-decision",
            Point::DieInTcpRepair => "die-in-tcp-repair",
            Point::DieInRelease => "die-in-release",
        }
    }
}

fn plan() -> Option<&'static (String, u64)> {
    static PLAN: OnceLock<Option<(String, u64)>> = OnceLock::new();
    PLAN.get_or_init(|| {
        let v = std::env::var("STASIS_FAULT").ok()?;
        let (p, n) = v.split_once(':')?;
        Some((p.to_string(), n.parse().ok()?))
    })
    .as_ref()
}

/// `Err` (an `EIO` error naming the point) if this pass through `point` is
/// the one `STASIS_FAULT` asks to fail.
pub fn check(point: Point) -> std::io::Result<()> {
    if hit(point) {
        return Err(std::io::Error::other(format!(
            "injected fault at {} (STASIS_FAULT)",
            point.name()
        )));
    }
    Ok(())
}

/// True on the pass through `point` that `STASIS_FAULT` names.
fn hit(point: Point) -> bool {
    static SEEN: [AtomicU64; 9] = [const { AtomicU64::new(0) }; 9];
    let Some((name, n)) = plan() else {
        return false;
    };
    if name != point.name() {
        return false;
    }
    let i = match point {
        Point::RemoteSyscall => 0,
        Point::ImageWrite => 1,
        Point::DieInRemoteSyscall => 2,
        Point::DieAfterCommit => 3,
        Point::DieAfterKill => 4,
        Point::DieInClusterRound => 5,
        Point::DieAfterDecision => 6,
        Point::DieInTcpRepair => 7,
        Point::DieInRelease => 8,
    };
    SEEN[i].fetch_add(1, Ordering::Relaxed) + 1 == *n
}

/// Places [`delay`] can stretch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slow {
    /// A dump, right before it stops the tree (`freeze`): one host of a
    /// cluster cut late, its job running on while the others are frozen.
    Freeze,
    /// A restore, right after each TCP connection is reconnected in repair
    /// mode: the tree's other connections wait longer for theirs.
    TcpReconnect,
    /// The application library's background copier, before each megabyte
    /// it copies: the program's writes meet pages not copied yet.
    AppCopy,
}

/// Test hook: `STASIS_TEST_DELAY=PLACE:MS` (`freeze`, `tcp-reconnect`,
/// `app-copy`)
/// makes every pass through that place sleep MS milliseconds. Unset, one `OnceLock` read.
pub fn delay(place: Slow) {
    static PLAN: OnceLock<Option<(String, u64)>> = OnceLock::new();
    let plan = PLAN.get_or_init(|| {
        let v = std::env::var("STASIS_TEST_DELAY").ok()?;
        let (p, ms) = v.split_once(':')?;
        Some((p.to_string(), ms.parse().ok()?))
    });
    let name = match place {
        Slow::Freeze => "freeze",
        Slow::TcpReconnect => "tcp-reconnect",
        Slow::AppCopy => "app-copy",
    };
    if let Some((p, ms)) = plan {
        if p == name {
            std::thread::sleep(std::time::Duration::from_millis(*ms));
        }
    }
}

/// Dies by SIGKILL if this pass through `point` is the one `STASIS_FAULT`
/// names.
pub fn die_at(point: Point) {
    if hit(point) {
        // SAFETY: kill(2) with our own pid and a constant signal number.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    }
}
