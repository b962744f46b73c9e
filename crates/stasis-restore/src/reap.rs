//! Nothing left behind: a failed restore kills and reaps the whole
//! half-built tree; a watchdog reaps dead threads meanwhile; saved PIDs are
//! waited for until free.

use std::time::{Duration, Instant};

use stasis_kernel::procfs::ReadError;

use crate::proc::Proc;
use crate::{RestoreError, Result};

/// How long a failed restore waits for the half-built tree it killed to be
/// reaped (a few milliseconds in practice).
pub(crate) const REAP_WAIT: Duration = Duration::from_secs(5);

/// Kills every process of a half-built tree (and the PID namespace's init
/// `init`, if any) and reaps all of their tasks: the threads and processes
/// it traces must be reaped by the restorer itself (a traced thread that
/// died is a zombie until its tracer waits for it, and the root cannot be
/// reaped before its threads), and with the restorer a subreaper the
/// orphaned processes come to it too. Bounded by [`REAP_WAIT`].
pub(crate) fn kill_tree(procs: impl IntoIterator<Item = Proc>, init: Option<i32>) {
    let mut pids = Vec::new();
    for mut p in procs {
        for (t, _) in &mut p.threads {
            t.forget();
        }
        p.t.forget();
        pids.push(p.t.pid());
    }
    pids.extend(init);
    let left = stasis_kernel::child::kill_and_reap_all(&pids, REAP_WAIT);
    if !left.is_empty() {
        tracing::warn!(
            "tasks {left:?} of the abandoned restore were not reaped within {REAP_WAIT:?}"
        );
    }
}

/// Kills the root stub (not adopted yet) and the namespace's init, if any.
pub(crate) fn kill_stub(root: i32, init: Option<i32>) {
    let left = stasis_kernel::child::kill_and_reap_all(&[root, init.unwrap_or(0)], REAP_WAIT);
    if !left.is_empty() {
        tracing::warn!("tasks {left:?} of the abandoned restore were not reaped");
    }
}

/// While a tree is being built: reaps the dead non-leader threads of
/// every process under the restorer, so that a process killed from outside
/// (`kill -9`, the OOM killer, a lazy filler that found a damaged page)
/// makes the remote syscall waiting on it fail at once instead of waiting
/// forever for a leader whose exit the kernel holds back until its traced
/// threads are reaped (see `stasis_kernel::child::reap_dead_threads`).
pub(crate) struct Watchdog {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watchdog {
    pub fn start() -> Watchdog {
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("restore-watchdog".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    for p in descendants_of_self() {
                        stasis_kernel::child::reap_dead_threads(p);
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            })
            .ok();
        Watchdog { stop, thread }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Every descendant of this process (children of any of its threads,
/// recursively).
fn descendants_of_self() -> Vec<i32> {
    let me = std::process::id() as i32;
    let mut all = stasis_kernel::procfs::tree_pids(&[me]);
    all.retain(|p| *p != me);
    all
}

/// Waits until `pid` is free: returns at once if it is, waits out a zombie
/// (this machine's init reaps orphans late) up to `wait`, and refuses a
/// live process.
pub fn wait_pid_free(pid: i32, wait: Duration) -> Result<()> {
    let t0 = Instant::now();
    loop {
        let stat = match stasis_kernel::procfs::stat(pid) {
            Ok(s) => s,
            Err(ReadError::Io { .. }) => return Ok(()),
            // A stat that does not parse is no zombie's.
            Err(ReadError::Format { .. }) => {
                return Err(RestoreError::PidTaken {
                    pid,
                    by: String::new(),
                })
            }
        };
        if stat.state != 'Z' && stat.state != 'X' {
            return Err(RestoreError::PidTaken { pid, by: stat.comm });
        }
        if t0.elapsed() >= wait {
            return Err(RestoreError::PidZombie { pid, waited: wait });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
