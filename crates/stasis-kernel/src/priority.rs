//! The dumping thread's own scheduling priority while a tree is frozen.
//!
//! A frozen tree's downtime is the dumper's working time, and on a busy
//! host (an MPI node whose other ranks spin on every core) the dumper
//! spends most of that time waiting for a CPU. [`Boost`] raises the nice
//! value of the calling thread alone (Linux's per-thread `setpriority`)
//! while the tree is frozen, and puts it back when dropped. Without
//! `CAP_SYS_NICE` nothing changes.

/// The calling thread's nice value, raised until dropped.
#[derive(Debug)]
pub struct Boost {
    tid: libc::id_t,
    before: i32,
}

/// How far the dumping thread's nice value is raised.
pub const FROZEN_NICE: i32 = -10;

impl Boost {
    /// Raises the calling thread to nice `nice` if that is above its own
    /// priority; `None` if it already is as high, or may not be raised.
    pub fn raise(nice: i32) -> Option<Boost> {
        let tid = libc::id_t::try_from(nix::unistd::gettid().as_raw()).ok()?;
        let before = get(tid)?;
        if before <= nice {
            return None;
        }
        set(tid, nice).then_some(Boost { tid, before })
    }
}

impl Drop for Boost {
    fn drop(&mut self) {
        // Lowering one's own priority needs no privilege.
        set(self.tid, self.before);
    }
}

/// The nice value of thread `tid`.
fn get(tid: libc::id_t) -> Option<i32> {
    nix::errno::Errno::clear();
    // SAFETY: getpriority takes integers only; -1 is a valid nice value,
    // told from an error by errno.
    let v = unsafe { libc::getpriority(libc::PRIO_PROCESS, tid) };
    (v != -1 || nix::errno::Errno::last_raw() == 0).then_some(v)
}

/// Sets the nice value of thread `tid`; whether it worked.
fn set(tid: libc::id_t, nice: i32) -> bool {
    // SAFETY: setpriority takes integers only.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, nice) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_boost_is_undone_when_dropped() {
        let tid = libc::id_t::try_from(nix::unistd::gettid().as_raw()).unwrap();
        let before = get(tid).unwrap();
        {
            let b = Boost::raise(before - 1);
            let privileged = crate::probe::effective_caps() & (1 << stasis_sys::CAP_SYS_NICE) != 0;
            if privileged {
                assert!(b.is_some());
                assert_eq!(get(tid), Some(before - 1));
            }
        }
        assert_eq!(get(tid), Some(before));
        assert!(Boost::raise(before).is_none(), "not above its own");
    }
}
