//! Which process each tree of a job is, beyond its PID.
//!
//! A PID names a process only while it lives: once a tree's root has
//! exited, the kernel may give its number to any other program (here
//! `pid_max` is 32768, reached in minutes on a busy host). `cluster run`
//! names a job's trees by PID from one round to the next, and asks every
//! agent whether they still run; without more, a root that exited
//! between two rounds and whose PID another program took would make that
//! program part of the job: reported alive (the run never ends) and
//! frozen and dumped each round.
//!
//! So an agent remembers, per job and PID, the start time of the process
//! it dumped or restored there (`/proc/PID/stat` field 22, which no two
//! processes of one boot share at one PID): a process with another start
//! time at that PID is not the job's. A dump of it is refused by name, and
//! it is not reported alive. What is remembered lives as long as the
//! agent: an agent started again takes the processes it finds at the
//! PIDs it is first given as the job's, as the first round does.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, OnceLock};

fn all() -> MutexGuard<'static, HashMap<(String, i32), u64>> {
    static KNOWN: OnceLock<Mutex<HashMap<(String, i32), u64>>> = OnceLock::new();
    KNOWN
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The start time of the process at `pid` now (`None`: no process).
fn started(pid: i32) -> Option<u64> {
    stasis_kernel::procfs::stat(pid).ok().map(|s| s.start_time)
}

/// Whether the process at `pid` is another one than the job's tree seen
/// there before: `Some(why)` if so. The first time a PID of a job is
/// seen, its process is taken as the tree (and remembered).
pub(crate) fn check_or_learn(job: &str, pid: i32) -> Option<String> {
    let now = started(pid)?;
    let mut known = all();
    let was = *known.entry((job.to_string(), pid)).or_insert(now);
    (was != now).then(|| {
        format!(
            "tree {pid}: the process with this PID is not the job's any more (it started {now} \
             clock ticks after boot, the job's tree at {was}): the tree exited and its PID \
             was taken by another program; dump the job's trees by their new PIDs (a new job \
             started since: give it another --job name)"
        )
    })
}

/// Whether `pid` runs and is the job's tree (or was never seen: then any
/// process there is taken as it).
pub(crate) fn runs_as_seen(job: &str, pid: i32) -> bool {
    if stasis_kernel::procfs::gone_or_zombie(pid) {
        return false;
    }
    let Some(now) = started(pid) else {
        return false;
    };
    all()
        .get(&(job.to_string(), pid))
        .is_none_or(|&was| was == now)
}

/// Remembers the process now at `pid` as the job's tree (after a restore
/// made it).
pub(crate) fn learn(job: &str, pid: i32) {
    if let Some(now) = started(pid) {
        all().insert((job.to_string(), pid), now);
    }
}

/// Forgets the trees of `job` (a dump that killed them).
pub(crate) fn forget_job(job: &str) {
    all().retain(|(j, _), _| j != job);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A process at a remembered PID with another start time is not the
    /// job's: refused by name and not alive; the first sighting is learnt,
    /// and a job forgotten learns again.
    #[test]
    fn another_process_at_a_known_pid_is_not_the_job() {
        let me = i32::try_from(std::process::id()).unwrap();
        let job = "identity-unit-test";
        assert_eq!(check_or_learn(job, me), None);
        assert_eq!(check_or_learn(job, me), None);
        assert!(runs_as_seen(job, me));
        // As if the tree seen here had started at another time.
        let real = started(me).unwrap();
        all().insert((job.to_string(), me), real + 1);
        let why = check_or_learn(job, me).expect("another process is refused");
        assert!(why.contains(&format!("tree {me}")), "{why}");
        assert!(why.contains("taken by another program"), "{why}");
        assert!(!runs_as_seen(job, me));
        learn(job, me);
        assert!(runs_as_seen(job, me));
        all().insert((job.to_string(), me), real + 1);
        forget_job(job);
        assert_eq!(check_or_learn(job, me), None);
        // A PID with no process: nothing to refuse, and not alive.
        forget_job(job);
        let mut c = std::process::Command::new("true").spawn().unwrap();
        let gone = i32::try_from(c.id()).unwrap();
        c.wait().unwrap();
        assert_eq!(check_or_learn(job, gone), None);
        assert!(!runs_as_seen(job, gone));
    }
}
