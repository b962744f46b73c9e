//! Helpers shared by the integration tests: small image directories and a
//! server on loopback.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use stasis_image::*;
use stasis_pageserver::tls::Transport;
use stasis_pageserver::{Server, ServerConfig};

pub const TOKEN: &[u8] = b"correct horse battery staple";

/// `npages` pages whose content identifies (seed, page).
pub fn pages(seed: u64, npages: usize) -> Vec<u8> {
    let mut v = vec![0u8; npages * 4096];
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for chunk in v.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
    v
}

pub fn process(pid: i32, pack: Option<PackRef>) -> ProcessImage {
    ProcessImage {
        pid,
        ppid: 1,
        pgid: pid,
        sid: pid,
        comm: format!("proc{pid}"),
        exe: "/usr/bin/true".into(),
        cwd: "/".into(),
        umask: 0o22,
        personality: 0,
        creds: Credentials::default(),
        rlimits: vec![],
        mm: MmImage::default(),
        vmas: vec![],
        fds: vec![],
        sigactions: vec![],
        shared_pending: vec![],
        itimers: vec![],
        threads: vec![],
        pack,
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

pub fn manifest(checkpoint: u32, parent: Option<u32>, processes: Vec<ProcessImage>) -> Manifest {
    Manifest {
        checkpoint,
        parent,
        tool_version: "0.1.0-test".into(),
        created_unix: 1_700_000_000,
        host: HostInfo::default(),
        root_pid: processes.first().map_or(1, |p| p.pid),
        processes,
        stats: DumpStats::default(),
        pipes: vec![],
        ghosts: vec![],
        shm_files: vec![],
        sysv_shm: vec![],
        cut: None,
        namespaces: None,
        shell_job: None,
        content: None,
        cgroups: None,
    }
}

/// The runs of one process: (pid, [(vaddr, npages, seed)]).
pub type Proc<'a> = (i32, &'a [(u64, usize, u64)]);

/// Writes a checkpoint of `procs`.
pub fn write_cp(image: &ImageDir, parent: Option<u32>, procs: &[Proc]) -> u32 {
    let mut b = image.begin_checkpoint().expect("begin");
    let mut ps = Vec::new();
    for &(pid, runs) in procs {
        let mut w = b.create_pack(pid).expect("create pack");
        for &(vaddr, n, seed) in runs {
            w.write_run(vaddr, &pages(seed, n)).expect("write_run");
        }
        let mut p = process(pid, Some(w.finish().expect("finish")));
        if parent.is_some() {
            p.data_ranges = Some(vec![
                (0x1000_0000, 0x1000_0000 + 300 * 4096),
                (0x2000_0000, 0x2000_1000),
            ]);
        }
        ps.push(p);
    }
    let m = manifest(b.number(), parent, ps);
    b.commit(&m).expect("commit")
}

/// An image with a full checkpoint 1 (two processes, one with a run split
/// at 256 pages, plus an extra `touch-set` file) and an incremental
/// checkpoint 2 over it.
pub fn image(root: &Path) -> PathBuf {
    let dir = root.join("img");
    let image = ImageDir::create_or_open(&dir).expect("create image");
    let one = write_cp(
        &image,
        None,
        &[
            (100, &[(0x1000_0000, 300, 1), (0x2000_0000, 1, 2)]),
            (200, &[(0x7f00_0000_0000, 3, 3)]),
        ],
    );
    assert_eq!(one, 1);
    fs::write(
        cp_dir(&dir, 1).join("touch-set"),
        b"0x10000000 0x10001000\n",
    )
    .expect("touch-set");
    let two = write_cp(&image, Some(1), &[(100, &[(0x1000_2000, 2, 4)])]);
    assert_eq!(two, 2);
    dir
}

pub fn cp_dir(dir: &Path, n: u32) -> PathBuf {
    dir.join("checkpoints").join(checkpoint_dir_name(n))
}

/// Starts a server (TLS) for `dir` on a free loopback port; returns its
/// address.
pub fn serve(dir: &Path, token: &[u8]) -> String {
    serve_with(dir, token, Transport::Tls)
}

/// Starts a server for `dir` with `transport`; returns its address.
pub fn serve_with(dir: &Path, token: &[u8], transport: Transport) -> String {
    let server = Server::bind(ServerConfig {
        dir: dir.to_path_buf(),
        listen: "127.0.0.1:0".into(),
        token: token.to_vec(),
        transport,
    })
    .expect("bind");
    let addr = server.local_addr().to_string();
    std::thread::spawn(move || server.serve());
    addr
}

/// Every file under `checkpoints/` of `dir`, by relative path.
pub fn checkpoint_files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let cps = dir.join("checkpoints");
    for cp in fs::read_dir(&cps).expect("list") {
        let cp = cp.expect("entry");
        for f in fs::read_dir(cp.path()).expect("list cp") {
            let f = f.expect("entry");
            if !f.file_type().expect("type").is_file() {
                continue;
            }
            let rel = format!(
                "{}/{}",
                cp.file_name().to_string_lossy(),
                f.file_name().to_string_lossy()
            );
            out.insert(rel, fs::read(f.path()).expect("read"));
        }
    }
    out
}

/// The runs of every pack of checkpoint `n`, with the pack's name and path.
pub fn packs(dir: &Path, n: u32) -> Vec<(String, PathBuf, Vec<RunEntry>)> {
    let image = ImageDir::open(dir).expect("open");
    let cp = image.load(Some(n)).expect("load");
    cp.manifest
        .processes
        .iter()
        .filter_map(|p| p.pack.as_ref())
        .map(|r| {
            let reader = cp.open_pack(r).expect("open pack");
            (
                r.name.clone(),
                cp.pack_path(r).expect("path"),
                reader.runs().to_vec(),
            )
        })
        .collect()
}

pub fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    fs::symlink_metadata(path)
        .expect("stat")
        .permissions()
        .mode()
        & 0o7777
}
