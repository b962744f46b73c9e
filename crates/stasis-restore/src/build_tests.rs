//! Unit tests of `build.rs` (the restore's decisions, over the recording fake).
use super::*;
use crate::remote::{Call, Recorder};

fn anon(start: u64, end: u64, prot: i32) -> Vma {
    Vma {
        start,
        end,
        prot: prot.unsigned_abs(),
        shared: false,
        growsdown: false,
        flags: 0,
        guards: Vec::new(),
        name: String::new(),
        kind: VmaKind::Anon,
        shm: None,
    }
}

fn run(vaddr: u64, npages: u32, file_off: u64) -> RunEntry {
    RunEntry {
        vaddr,
        npages,
        flags: 0,
        file_off,
        checksum: 0,
    }
}

#[test]
fn gap_avoids_busy_ranges_with_guards() {
    let busy = [
        (0x5555_0000_0000, 0x5555_0001_0000),
        (0x7fff_0000_0000, 0x7fff_ffff_f000),
    ];
    let g = find_gap(&busy, 0x8000).unwrap();
    assert!(
        g + 0x8000 + 4096 <= 0x7fff_0000_0000 && g >= 0x5555_0001_0000,
        "{g:#x}"
    );
    assert_eq!(g % 4096, 0);
    // The vsyscall page lies above the user range: never a gap's end.
    let g = find_gap(
        &[
            (0x7ffd_0000_0000, 0x7ffd_0001_0000),
            (0xffff_ffff_ff60_0000, 0xffff_ffff_ff60_1000),
        ],
        0x8000,
    )
    .unwrap();
    assert!(g + 0x8000 < 0x7fff_ffff_f000, "{g:#x}");
    // Nothing fits when everything above 4 GiB is taken.
    assert_eq!(find_gap(&[(1 << 32, 0x7fff_ffff_f000)], 4096), None);
}

#[test]
fn readonly_area_with_data_is_mapped_writable_filled_then_protected() {
    let mut r = Recorder::default();
    let v = anon(0x10000, 0x14000, libc::PROT_READ);
    let n = map_vma(
        &mut r,
        &v,
        &[(
            &[run(0x10000, 2, 4096), run(0x13000, 1, 4096 + 8192)][..],
            7,
        )],
        None,
    )
    .unwrap();
    assert_eq!(n, 3 * 4096);
    // Small runs are not pre-populated.
    assert_eq!(r.names(), vec!["mmap", "preadv", "mprotect"]);
    let mmap = &r.args_of("mmap")[0];
    assert_eq!(mmap[2], (libc::PROT_READ | libc::PROT_WRITE) as u64);
    assert_eq!(
        mmap[3],
        (libc::MAP_FIXED | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64
    );
    // One preadv for both file-contiguous runs, at the first run's offset.
    let p = &r.args_of("preadv")[0];
    assert_eq!((p[0], p[2], p[3]), (7, 2, 4096));
    assert_eq!(
        r.args_of("mprotect")[0],
        vec![0x10000, 0x4000, libc::PROT_READ as u64]
    );
}

#[test]
fn pages_of_a_chain_are_read_from_each_pack() {
    // An incremental checkpoint: page 1 from its own pack (fd 7), pages
    // 0 and 2 from its parent's (fd 8).
    let mut r = Recorder::default();
    let v = anon(0x10000, 0x13000, libc::PROT_READ | libc::PROT_WRITE);
    let own = [run(0x11000, 1, 4096)];
    let parent = [run(0x10000, 1, 4096), run(0x12000, 1, 3 * 4096)];
    let n = map_vma(&mut r, &v, &[(&own[..], 7), (&parent[..], 8)], None).unwrap();
    assert_eq!(n, 3 * 4096);
    let p = r.args_of("preadv");
    // One read from the child's pack; two from the parent's, whose runs
    // are not file-contiguous.
    assert_eq!(
        p.iter().map(|a| (a[0], a[2], a[3])).collect::<Vec<_>>(),
        vec![(7, 1, 4096), (8, 1, 4096), (8, 1, 3 * 4096)]
    );
}

#[test]
fn empty_area_is_mapped_with_final_protection_and_not_filled() {
    let mut r = Recorder::default();
    map_vma(&mut r, &anon(0x10000, 0x12000, libc::PROT_NONE), &[], None).unwrap();
    assert_eq!(r.names(), vec!["mmap"]);
    assert_eq!(r.args_of("mmap")[0][2], 0);
}

// The rings of an io_uring instance are made with its fd, later: the
// area is only held, inaccessible, so that nothing else lands there.
#[test]
fn an_io_uring_area_is_held_empty_for_its_fd() {
    let mut r = Recorder::default();
    let mut v = anon(0x10000, 0x12000, libc::PROT_READ | libc::PROT_WRITE);
    v.shared = true;
    v.kind = VmaKind::IoUring { ino: 7, offset: 0 };
    assert_eq!(map_vma(&mut r, &v, &[], None).unwrap(), 0);
    assert_eq!(r.names(), vec!["mmap"]);
    let a = &r.args_of("mmap")[0];
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED | libc::MAP_NORESERVE;
    assert_eq!(
        (a[0], a[1], a[2], a[3]),
        (0x10000, 0x2000, 0, u64::from(flags.unsigned_abs()))
    );
}

#[test]
fn runs_are_clipped_to_areas() {
    let all = [run(0x10000, 4, 4096), run(0x20000, 2, 5 * 4096)];
    assert_eq!(
        clip_runs(&all, 0x12000, 0x21000),
        vec![run(0x12000, 2, 3 * 4096), run(0x20000, 1, 5 * 4096)]
    );
    assert_eq!(clip_runs(&all, 0x14000, 0x20000), vec![]);
    assert_eq!(clip_runs(&all, 0x0, 0x100000), all.to_vec());
}

#[test]
fn large_contiguous_stretches_are_populated_first() {
    let mut r = Recorder::default();
    fill(
        &mut r,
        &[
            run(0x100000, 8, 4096),
            run(0x108000, 8, 9 * 4096),
            run(0x200000, 2, 17 * 4096),
        ],
        3,
    )
    .unwrap();
    assert_eq!(r.names(), vec!["madvise", "preadv"]);
    assert_eq!(r.args_of("madvise")[0], vec![0x100000, 16 * 4096, 23]);
}

#[test]
fn file_contiguity_breaks_preadv_batches() {
    let mut r = Recorder::default();
    fill(
        &mut r,
        &[run(0x10000, 1, 4096), run(0x20000, 1, 3 * 4096)],
        3,
    )
    .unwrap();
    assert_eq!(r.names(), vec!["preadv", "preadv"]);
}

#[test]
fn private_file_mapping_opens_maps_and_closes() {
    let mut r = Recorder::default();
    let v = Vma {
        kind: VmaKind::File {
            path: "/lib/x.so".into(),
            offset: 0x2000,
            dev: 0,
            ino: 0,
        },
        ..anon(0x10000, 0x12000, libc::PROT_READ | libc::PROT_EXEC)
    };
    map_vma(&mut r, &v, &[], None).unwrap();
    assert_eq!(r.names(), vec!["open", "mmap", "close"]);
    assert_eq!(r.args_of("mmap")[0][4..], [100, 0x2000]);
    assert!(r
        .calls
        .iter()
        .any(|c| matches!(c, Call::Write { data, .. } if data == b"/lib/x.so\0")));
}

#[test]
fn failing_open_names_the_file() {
    let mut r = Recorder {
        fail_on: Some(("open", libc::ENOENT)),
        ..Default::default()
    };
    let v = Vma {
        kind: VmaKind::File {
            path: "/gone".into(),
            offset: 0,
            dev: 0,
            ino: 0,
        },
        ..anon(0x10000, 0x12000, libc::PROT_READ)
    };
    let e = map_vma(&mut r, &v, &[], None).unwrap_err().to_string();
    assert!(e.contains("/gone"), "{e}");
}

#[test]
fn only_armed_timers_are_set() {
    let mut r = Recorder::default();
    restore_itimers(
        &mut r,
        &[
            ITimer {
                which: 0,
                interval_us: 10_000,
                value_us: 2_500_000,
            },
            ITimer {
                which: 1,
                interval_us: 0,
                value_us: 0,
            },
        ],
    )
    .unwrap();
    assert_eq!(r.names(), vec!["setitimer"]);
    let w = r.writes()[0].clone();
    assert_eq!(w, words(&[0, 10_000, 2, 500_000]));
}

#[test]
fn thread_state_sets_everything_in_order() {
    let mut r = Recorder::default();
    let th = ThreadImage {
        tid: 42,
        regs: vec![0; 27],
        xstate: vec![],
        sigmask: 0,
        pending: vec![],
        altstack: stasis_image::manifest::AltStack {
            sp: 0x7000,
            flags: libc::SS_ONSTACK,
            size: 8192,
        },
        comm: "worker".into(),
        rseq: Some(stasis_image::manifest::RseqConfig {
            ptr: 0x9000,
            size: 32,
            signature: 0x53053053,
        }),
        seccomp: vec![(vec![6, 0, 0, 0, 0, 0, 0xff, 0x7f], 2)],
        seccomp_strict: false,
        clear_child_tid: 0x5000,
        robust_list: 0x6000,
        robust_list_len: 24,
        sched: None,
    };
    thread_state(&mut r, &th).unwrap();
    assert_eq!(
        r.names(),
        vec![
            "sigaltstack",
            "rseq",
            "set_robust_list",
            "set_tid_address",
            "seccomp",
            "prctl"
        ]
    );
    assert_eq!(r.args_of("rseq")[0], vec![0x9000, 32, 0, 0x53053053]);
    assert_eq!(r.args_of("set_robust_list")[0], vec![0x6000, 24]);
    assert_eq!(r.args_of("set_tid_address")[0], vec![0x5000]);
    // One instruction, flags passed through, sock_fprog in scratch.
    let sc = &r.args_of("seccomp")[0];
    assert_eq!((sc[0], sc[1]), (1, 2));
    // SS_ONSTACK is a state, not a flag one can set.
    let w = r.writes();
    assert_eq!(w[0], words(&[0x7000, 0, 8192]));
}

#[test]
fn the_filters_all_threads_share_are_counted_once() {
    let f = |n: u8| (vec![6, 0, 0, 0, n, 0, 0xff, 0x7f], 0u64);
    let mut p = crate::testutil::image(100, 1, 100, 100);
    p.threads = (0..3).map(|i| crate::testutil::thread(100 + i)).collect();
    assert_eq!(shared_seccomp(&p), 0);
    for th in &mut p.threads {
        th.seccomp = vec![f(1), f(2)];
    }
    p.threads[2].seccomp.push(f(3));
    assert_eq!(shared_seccomp(&p), 2);
    p.threads[1].seccomp[1] = f(9);
    assert_eq!(shared_seccomp(&p), 1);
    // The main thread installs the shared ones; each thread only the rest.
    let mut r = Recorder::default();
    thread_state_inheriting(&mut r, &p.threads[2], shared_seccomp(&p)).unwrap();
    assert_eq!(r.args_of("seccomp").len(), 2);
}

#[test]
fn a_thread_in_strict_mode_enters_it_again() {
    let mut r = Recorder::default();
    let mut th = crate::testutil::thread(43);
    th.seccomp_strict = true;
    thread_state(&mut r, &th).unwrap();
    assert_eq!(
        r.args_of("prctl(PR_SET_SECCOMP)"),
        [vec![libc::PR_SET_SECCOMP as u64, 1]]
    );
    th.seccomp_strict = false;
    let mut r = Recorder::default();
    thread_state(&mut r, &th).unwrap();
    assert!(r.args_of("prctl(PR_SET_SECCOMP)").is_empty());
}

#[test]
fn clone_thread_passes_set_tid() {
    let mut r = Recorder::default();
    // The recorder answers 0, not the TID: a mismatch is an error.
    assert!(clone_thread(&mut r, 77).is_err());
    let w = r.writes();
    assert_eq!(w[0], 77i32.to_le_bytes());
    assert_eq!(
        u64::from_le_bytes(w[1][0..8].try_into().unwrap()),
        THREAD_CLONE_FLAGS
    );
    assert_eq!(u64::from_le_bytes(w[1][72..80].try_into().unwrap()), 1);
    assert_eq!(r.args_of("clone3")[0][1], 88);
}

#[test]
fn periodic_posix_timers_caught_at_expiry_stay_armed() {
    let mut r = Recorder::default();
    let t = |id, value_ns, interval_ns| PosixTimer {
        id,
        clockid: 1,
        notify: 0,
        signo: 10,
        tid: 0,
        value: 0,
        value_ns,
        interval_ns,
    };
    arm_posix_timers(&mut r, &[t(1, 0, 10_000_000), t(2, 0, 0), t(3, 5, 0)]).unwrap();
    let armed: Vec<u64> = r.args_of("timer_settime").iter().map(|a| a[0]).collect();
    assert_eq!(armed, vec![1, 3]);
    let w = r.writes();
    assert_eq!(w[0], words(&[0, 10_000_000, 0, 1]));
}

#[test]
fn mm_map_struct_layout() {
    let mut r = Recorder::default();
    let mm = MmImage {
        start_code: 1,
        end_code: 2,
        brk: 6,
        auxv: vec![33, 44],
        ..Default::default()
    };
    restore_mm(&mut r, &mm, 5).unwrap();
    let p = &r.args_of("prctl")[0];
    assert_eq!((p[0], p[1], p[3]), (35, 14, 104));
    let data = r.writes();
    assert_eq!(data[0], words(&[33, 44]));
    let s = &data[1];
    assert_eq!(s.len(), 104);
    assert_eq!(u64::from_le_bytes(s[40..48].try_into().unwrap()), 6);
    assert_eq!(u32::from_le_bytes(s[96..100].try_into().unwrap()), 16);
    assert_eq!(u32::from_le_bytes(s[100..104].try_into().unwrap()), 5);
}

#[test]
fn an_area_gets_its_advice_before_the_fill_and_its_lock_after() {
    let mut r = Recorder::default();
    let v = Vma {
        flags: vmflags::HUGEPAGE | vmflags::DONTFORK | vmflags::LOCKED | vmflags::NORESERVE,
        ..anon(0x10000, 0x12000, libc::PROT_READ)
    };
    let runs = [run(0x10000, 1, 0)];
    map_vma(&mut r, &v, &[(&runs, 7)], None).unwrap();
    assert_eq!(
        r.names(),
        vec!["mmap", "madvise", "madvise", "preadv", "mprotect", "mlock2"]
    );
    let flags = r.args_of("mmap")[0][3];
    assert_ne!(flags & libc::MAP_NORESERVE as u64, 0);
    let advice: Vec<u64> = r.args_of("madvise").iter().map(|a| a[2]).collect();
    assert_eq!(
        advice,
        [libc::MADV_DONTFORK as u64, libc::MADV_HUGEPAGE as u64]
    );
    assert_eq!(r.args_of("mlock2")[0][..3], [0x10000, 0x2000, 0]);
    // Guard pages: installed after the fill.
    let mut r = Recorder::default();
    let g = Vma {
        guards: vec![(0x11000, 0x12000)],
        ..anon(0x10000, 0x12000, libc::PROT_READ)
    };
    map_vma(&mut r, &g, &[(&runs, 7)], None).unwrap();
    assert_eq!(r.names(), vec!["mmap", "preadv", "mprotect", "madvise"]);
    assert_eq!(r.args_of("madvise")[0][..3], [0x11000, 0x1000, 102]);
    // Locked on fault: mlock2(MLOCK_ONFAULT).
    let mut r = Recorder::default();
    let v = Vma {
        flags: vmflags::LOCKED | vmflags::LOCKONFAULT,
        ..v
    };
    map_vma(&mut r, &v, &[], None).unwrap();
    assert_eq!(r.args_of("mlock2")[0][2], vmflags::MLOCK_ONFAULT);
}

#[test]
fn a_droppable_area_is_mapped_droppable_not_private() {
    let mut r = Recorder::default();
    let v = Vma {
        flags: vmflags::DROPPABLE,
        ..anon(0x10000, 0x12000, libc::PROT_READ | libc::PROT_WRITE)
    };
    map_vma(&mut r, &v, &[], None).unwrap();
    let flags = r.args_of("mmap")[0][3];
    assert_eq!(flags & 0x0f, vmflags::MAP_DROPPABLE as u64);
}

#[test]
fn a_read_only_shared_file_mapping_that_may_be_made_writable_opens_its_file_for_writing() {
    let file = VmaKind::File {
        path: "/data/f".into(),
        offset: 0,
        dev: 0,
        ino: 0,
    };
    let open_mode = |flags: u32, shared: bool| {
        let mut r = Recorder::default();
        let v = Vma {
            kind: file.clone(),
            shared,
            flags,
            ..anon(0x10000, 0x12000, libc::PROT_READ)
        };
        map_vma(&mut r, &v, &[], None).unwrap();
        r.args_of("open")[0][1] & libc::O_ACCMODE as u64
    };
    assert_eq!(open_mode(vmflags::MAYWRITE, true), libc::O_RDWR as u64);
    assert_eq!(open_mode(0, true), libc::O_RDONLY as u64);
    assert_eq!(open_mode(0, false), libc::O_RDONLY as u64);
}

/// The ring `io_setup(n)` makes, as the kernel sizes it (`ioctx_alloc`,
/// `aio_setup_ring`) with `cpus` possible CPUs: its length in bytes.
fn kernel_aio_ring_len(n: u64, cpus: u64) -> u64 {
    let events = n.max(cpus * 4) * 2 + 2;
    (32 + events * 32).div_ceil(4096) * 4096
}

#[test]
fn an_aio_ring_is_made_again_at_its_size() {
    for pages in 1..=64u64 {
        let len = pages * 4096;
        let n = aio_setup_arg(len);
        assert_eq!(aio_ring_events(len), (len - 32) / 32);
        // With the CPUs of this kind of machine, the same ring.
        if n >= 2 * 4 {
            assert_eq!(kernel_aio_ring_len(n, 2), len, "{pages} pages");
        }
    }
    // io_setup(128) on 2 CPUs: 3 pages, 383 events.
    assert_eq!(kernel_aio_ring_len(128, 2), 3 * 4096);
    assert_eq!(aio_ring_events(3 * 4096), 383);
    assert_eq!(kernel_aio_ring_len(aio_setup_arg(3 * 4096), 2), 3 * 4096);
}

#[test]
fn a_tid_taken_meanwhile_is_tried_again_then_named() {
    let mut r = Recorder {
        fail_on: Some(("clone3", libc::EEXIST)),
        ..Default::default()
    };
    let e = clone_thread(&mut r, 4_000_000).unwrap_err();
    assert!(
        matches!(e, RestoreError::PidTaken { pid: 4_000_000, .. }),
        "{e:?}"
    );
    // No process shows TID 4000000 here: tried again for a second (a task
    // being created or ending holds a TID /proc does not show), then
    // refused saying so.
    let text = e.to_string();
    assert!(
        text.contains("in use") && text.contains("/proc does not show"),
        "{text}"
    );
    assert_eq!(r.args_of("clone3").len(), 51, "{:?}", r.names());
    // A TID /proc shows (this test's own process): refused at once, by name.
    let me = i32::try_from(std::process::id()).unwrap();
    let mut r = Recorder {
        fail_on: Some(("clone3", libc::EEXIST)),
        ..Default::default()
    };
    let text = clone_thread(&mut r, me).unwrap_err().to_string();
    let comm = std::fs::read_to_string("/proc/self/comm").unwrap();
    assert!(text.contains(comm.trim()), "{text}");
    assert_eq!(r.args_of("clone3").len(), 1);
    // Another failure stays a failed step naming the thread.
    let mut r = Recorder {
        fail_on: Some(("clone3", libc::EPERM)),
        ..Default::default()
    };
    let text = clone_thread(&mut r, 4_000_000).unwrap_err().to_string();
    assert!(text.contains("creating thread 4000000"), "{text}");
}
