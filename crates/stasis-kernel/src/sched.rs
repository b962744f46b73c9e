//! A thread's scheduling policy and parameters, read and set from outside
//! (`sched_getattr`/`sched_setattr` take any thread id).

use std::io;

use stasis_sys::SchedAttr;

const SIZE: u32 = stasis_sys::SCHED_ATTR_SIZE;

/// The policy, nice value, real-time priority, deadline parameters and
/// flags of thread `tid`.
pub fn get(tid: i32) -> io::Result<SchedAttr> {
    let mut a = SchedAttr {
        size: SIZE,
        ..SchedAttr::default()
    };
    // SAFETY: `a` is a writable sched_attr of the size passed.
    let r = unsafe {
        libc::syscall(
            libc::SYS_sched_getattr,
            tid,
            &mut a as *mut SchedAttr,
            SIZE,
            0,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(a)
}

/// Gives thread `tid` the policy and parameters `a` (its utilization
/// clamps left as they are).
pub fn set(tid: i32, a: &SchedAttr) -> io::Result<()> {
    let a = SchedAttr {
        size: SIZE,
        sched_flags: a.sched_flags & stasis_sys::SCHED_FLAGS_KEPT,
        sched_util_min: 0,
        sched_util_max: 0,
        ..*a
    };
    // SAFETY: `a` is a sched_attr whose `size` says how much to read.
    let r = unsafe { libc::syscall(libc::SYS_sched_setattr, tid, &a as *const SchedAttr, 0) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_reads_its_own_policy_and_sets_its_nice() {
        let tid = nix::unistd::gettid().as_raw();
        let a = get(tid).unwrap();
        assert_eq!(a.sched_policy, libc::SCHED_OTHER as u32);
        // Lowering one's own priority needs no privilege.
        let lower = SchedAttr {
            sched_nice: (a.sched_nice + 1).min(19),
            ..a
        };
        set(tid, &lower).unwrap();
        assert_eq!(get(tid).unwrap().sched_nice, lower.sched_nice);
    }
}
