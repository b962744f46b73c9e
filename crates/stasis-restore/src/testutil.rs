//! Builders of manifest pieces for the unit tests.

use stasis_image::manifest::{ProcessImage, ThreadImage, Vma, VmaKind};

/// A process with nothing but its identity.
pub fn image(pid: i32, ppid: i32, pgid: i32, sid: i32) -> ProcessImage {
    ProcessImage {
        pid,
        ppid,
        pgid,
        sid,
        comm: String::new(),
        exe: String::new(),
        cwd: String::new(),
        umask: 0,
        personality: 0,
        creds: Default::default(),
        rlimits: vec![],
        mm: Default::default(),
        vmas: vec![],
        fds: vec![],
        sigactions: vec![],
        shared_pending: vec![],
        itimers: vec![],
        threads: vec![],
        pack: None,
        zombie: None,
        posix_timers: vec![],
        no_new_privs: false,
        pdeath_signal: 0,
        child_subreaper: false,
        start_time: 0,
        data_ranges: None,
        oom_score_adj: None,
        thp_disabled: false,
        loginuid: None,
        dumpable: None,
        stopped: false,
        stop_signal: None,
        membarrier: 0,
        aio_rings: Vec::new(),
        pending_time: None,
        fds_shared_with: None,
        root: None,
    }
}

/// A thread with nothing to restore but its TID.
pub fn thread(tid: i32) -> ThreadImage {
    ThreadImage {
        tid,
        regs: vec![0; 27],
        xstate: vec![],
        sigmask: 0,
        pending: vec![],
        altstack: Default::default(),
        comm: String::new(),
        rseq: None,
        seccomp: vec![],
        seccomp_strict: false,
        clear_child_tid: 0,
        robust_list: 0,
        robust_list_len: 0,
        sched: None,
    }
}

/// An area of kind `kind`, read-write.
pub fn vma(start: u64, end: u64, kind: VmaKind, shared: bool) -> Vma {
    Vma {
        start,
        end,
        prot: (libc::PROT_READ | libc::PROT_WRITE).unsigned_abs(),
        shared,
        growsdown: false,
        flags: 0,
        guards: Vec::new(),
        name: String::new(),
        kind,
        shm: None,
    }
}
