//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::Path;

use stasis_image::*;

/// Deterministic pseudo-random bytes (xorshift), no extra dependency.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

/// `npages` pages of data whose content identifies (seed, page).
pub fn pages(seed: u64, npages: usize) -> Vec<u8> {
    let mut v = vec![0u8; npages * 4096];
    Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1).fill(&mut v);
    v
}

pub fn process(pid: i32, pack: Option<PackRef>) -> ProcessImage {
    ProcessImage {
        pid,
        ppid: 1,
        pgid: pid,
        sid: pid,
        comm: format!("proc{pid}"),
        exe: "/usr/bin/sleep".into(),
        cwd: "/".into(),
        umask: 0o22,
        personality: 0,
        creds: Credentials {
            uid: [1000; 4],
            gid: [1000; 4],
            groups: vec![4, 27],
            caps: None,
            groups_fixed: false,
        },
        rlimits: vec![Rlimit {
            resource: 7,
            soft: 1024,
            hard: 4096,
        }],
        mm: MmImage {
            start_code: 0x40_0000,
            end_code: 0x40_1000,
            auxv: vec![6, 4096, 0, 0],
            ..MmImage::default()
        },
        vmas: vec![
            Vma {
                start: 0x40_0000,
                end: 0x40_1000,
                prot: 5,
                shared: false,
                growsdown: false,
                flags: 0,
                guards: Vec::new(),
                name: String::new(),
                kind: VmaKind::File {
                    path: "/usr/bin/sleep".into(),
                    offset: 0,
                    dev: 0x803,
                    ino: 1234,
                },
                shm: None,
            },
            Vma {
                start: 0x7ffc_0000_0000,
                end: 0x7ffc_0002_1000,
                prot: 3,
                shared: false,
                growsdown: true,
                flags: 0,
                guards: Vec::new(),
                name: "[stack]".into(),
                kind: VmaKind::Anon,
                shm: Some((77, 0)),
            },
            Vma {
                start: 0x7ffc_1000_0000,
                end: 0x7ffc_1000_2000,
                prot: 5,
                shared: false,
                growsdown: false,
                flags: 0,
                guards: Vec::new(),
                name: "[vdso]".into(),
                kind: VmaKind::Vdso,
                shm: None,
            },
        ],
        fds: vec![FdImage {
            fd: 0,
            flags: 2,
            cloexec: false,
            kind: FdKind::Path {
                path: "/dev/null".into(),
                pos: 0,
                mode: 0o20666,
                size: 0,
            },
            shared_id: Some(3),
            owner: None,
            locks: vec![stasis_image::manifest::FileLock {
                kind: stasis_image::manifest::LockKind::Posix,
                write: true,
                start: 5,
                len: 10,
            }],
        }],
        sigactions: vec![SigAction {
            signo: 10,
            handler: 0x40_1234,
            flags: 0x0400_0000,
            restorer: 0x40_5678,
            mask: 0,
        }],
        shared_pending: vec![SigInfo {
            signo: 10,
            raw: vec![7; 128],
        }],
        itimers: vec![ITimer {
            which: 0,
            interval_us: 0,
            value_us: 5,
        }],
        threads: vec![ThreadImage {
            tid: pid,
            regs: (0..27).collect(),
            xstate: vec![0xAB; 64],
            sigmask: 0,
            pending: vec![],
            altstack: AltStack::default(),
            comm: format!("proc{pid}"),
            rseq: Some(RseqConfig {
                ptr: 0x7f00_0000_1000,
                size: 32,
                signature: 0x5305_3053,
            }),
            seccomp: vec![(vec![6, 0, 0, 0, 0, 0, 0xff, 0x7f], 0)],
            seccomp_strict: false,
            clear_child_tid: 0x7f00_0000_2000,
            robust_list: 0x7f00_0000_3000,
            robust_list_len: 24,
            sched: None,
        }],
        pack,
        zombie: None,
        posix_timers: vec![stasis_image::manifest::PosixTimer {
            id: 2,
            clockid: 1,
            notify: 0,
            signo: 10,
            tid: pid,
            value: 0x1234,
            value_ns: 5_000_000,
            interval_ns: 10_000_000,
        }],
        no_new_privs: true,
        pdeath_signal: 1,
        child_subreaper: true,
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

pub fn manifest(checkpoint: u32, processes: Vec<ProcessImage>) -> Manifest {
    Manifest {
        checkpoint,
        parent: None,
        tool_version: "0.1.0-test".into(),
        created_unix: 1_700_000_000,
        host: HostInfo {
            hostname: "testhost".into(),
            kernel_release: "6.8.0".into(),
            xfeatures: 0x2e7,
            page_size: 4096,
        },
        root_pid: processes.first().map_or(1, |p| p.pid),
        processes,
        stats: DumpStats::default(),
        pipes: vec![stasis_image::manifest::PipeImage {
            id: 9,
            capacity: 65536,
            data: b"in flight".to_vec(),
        }],
        ghosts: vec![stasis_image::manifest::GhostFile {
            id: 4,
            mode: 0o100600,
            data: b"deleted but open".to_vec(),
            seals: 0,
            size: 0,
            extents: Vec::new(),
            owner: Some((1000, 100)),
            times: Some(stasis_image::manifest::FileTimes {
                atime: (0, 5),
                mtime: (123_456, 0),
            }),
            hugetlb: false,
        }],
        shm_files: vec![],
        sysv_shm: vec![stasis_image::manifest::SysvShm {
            key: 0x5151,
            shmid: 3,
            mode: 0o1600,
            uid: 0,
            gid: 0,
            data: Vec::new(),
            size: 3 * 4096,
            extents: vec![
                stasis_image::manifest::Extent::inline(0, vec![1, 2, 3]),
                stasis_image::manifest::Extent::inline(8192, vec![4; 4096]),
            ],
        }],
        cut: Some(stasis_image::manifest::CutMark {
            job: "job".into(),
            round: 7,
        }),
        namespaces: None,
        shell_job: None,
        content: None,
        cgroups: None,
    }
}

/// Writes a checkpoint with one process (pid 100) whose pack holds
/// `runs` = (vaddr, npages, seed). Returns the committed number.
pub fn write_checkpoint(image: &ImageDir, runs: &[(u64, usize, u64)]) -> u32 {
    let mut b = image.begin_checkpoint().expect("begin");
    let mut w = b.create_pack(100).expect("create pack");
    for &(vaddr, n, seed) in runs {
        w.write_run(vaddr, &pages(seed, n)).expect("write_run");
    }
    let r = w.finish().expect("finish");
    let m = manifest(b.number(), vec![process(100, Some(r))]);
    b.commit(&m).expect("commit")
}

pub fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::symlink_metadata(path)
        .expect("stat")
        .permissions()
        .mode()
        & 0o7777
}

/// Asserts the message style of the crate: lowercase start, no trailing period.
pub fn assert_style(e: &ImageError) {
    let msg = e.to_string();
    let first = msg.chars().next().expect("empty message");
    assert!(!first.is_uppercase(), "message starts uppercase: {msg}");
    assert!(!msg.ends_with('.'), "message ends with a period: {msg}");
}
