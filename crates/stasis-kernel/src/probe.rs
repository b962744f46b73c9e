//! One-shot probe of the kernel facilities Stasis uses (`stasis check`).
//!
//! Every probe really exercises the facility (on this process or on a
//! throw-away traced child), rather than trusting version numbers: a kernel
//! can be configured without any of them.

use std::os::fd::AsRawFd;

use serde::Serialize;
use stasis_sys as sys;

use crate::child::{kill_and_reap, spawn_stopped};
use crate::mem::ProcessMemory;
use crate::pagemap::{Pagemap, ScanQuery};
use crate::{last_err, pidfd, uffd};

/// Result of probing one facility.
#[derive(Debug, Clone, Serialize)]
pub struct Feature {
    /// Short name (`ptrace`, `userfaultfd`, ...).
    pub name: &'static str,
    /// Whether it works here.
    pub available: bool,
    /// Needed for plain dump/restore (its absence makes `check` fail).
    pub required: bool,
    /// What was seen (version, sizes, error).
    pub detail: String,
    /// What it enables.
    pub enables: &'static str,
    /// What Stasis does without it.
    pub fallback: &'static str,
}

/// The whole probe.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub kernel: String,
    pub features: Vec<Feature>,
    /// userfaultfd feature bits by name, as the kernel reports them.
    pub uffd_features: Vec<&'static str>,
    /// XSAVE area size of this CPU (bytes) and XCR0.
    pub xstate_size: usize,
    pub xfeatures: u64,
    /// True when dump and restore can work.
    pub ok: bool,
}

#[allow(clippy::too_many_arguments)]
fn feat(
    name: &'static str,
    available: bool,
    required: bool,
    detail: String,
    enables: &'static str,
    fallback: &'static str,
) -> Feature {
    Feature {
        name,
        available,
        required,
        detail,
        enables,
        fallback,
    }
}

/// Kernel release (`uname -r`).
pub fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Whether this kernel tells a process its `membarrier` registrations
/// (`MEMBARRIER_CMD_GET_REGISTRATIONS`, Linux 6.3).
pub fn membarrier_registrations() -> bool {
    static KNOWN: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *KNOWN.get_or_init(|| {
        // SAFETY: membarrier(QUERY, 0, 0) takes integers and only returns
        // the mask of supported commands (or -1).
        let r = unsafe { libc::syscall(libc::SYS_membarrier, sys::MEMBARRIER_CMD_QUERY, 0, 0) };
        r > 0 && r.unsigned_abs() & sys::MEMBARRIER_CMD_GET_REGISTRATIONS != 0
    })
}

/// Effective capability mask of this process.
pub fn effective_caps() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .unwrap_or(0)
}

/// XCR0 from an XSAVE area read with `PTRACE_GETREGSET`: the kernel stores
/// it in the first word of the software-reserved bytes
/// (`USER_XSTATE_XCR0_WORD`).
pub fn xfeatures_of(xstate: &[u8]) -> u64 {
    let o = sys::XSAVE_SW_BYTES_OFFSET;
    xstate
        .get(o..o + 8)
        .map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
        .unwrap_or(0)
}

/// Runs every probe.
pub fn probe() -> Report {
    let mut features = Vec::new();
    let (xstate_size, xfeatures) = child_features(&mut features);
    let uffd_names = uffd_features(&mut features);
    // PAGEMAP_SCAN on our own pagemap.
    let scan = probe_pagemap_scan();
    features.push(feat(
        "PAGEMAP_SCAN",
        scan.is_ok(),
        false,
        scan.as_ref().map_or_else(ToString::to_string, Clone::clone),
        "finding populated pages (dump) and written pages (incremental) in one ioctl",
        "reading /proc/PID/pagemap (8 bytes per page)",
    ));

    let sd = probe_soft_dirty();
    features.push(feat(
        "soft-dirty",
        sd.is_ok(),
        false,
        sd.as_ref().map_or_else(ToString::to_string, Clone::clone),
        "dirty tracking without userfaultfd",
        "page hashing",
    ));

    let (c3, c3d) = probe_clone3_set_tid();
    features.push(feat(
        "clone3-set_tid",
        c3,
        true,
        c3d,
        "restoring processes at their saved PIDs",
        "none (restore into a new PID namespace needs it too)",
    ));

    let (mm, mmd) = probe_prctl_mm_map();
    features.push(feat(
        "PR_SET_MM_MAP",
        mm,
        true,
        mmd,
        "restoring brk, arg/env areas, auxv and exe link",
        "none",
    ));

    let (gfd, gfdd) = probe_pidfd_getfd();
    features.push(feat(
        "pidfd_getfd",
        gfd,
        false,
        gfdd,
        "taking fds (userfaultfd, sockets) out of a process",
        "none for plain dumps; needed for tracking and lazy restore",
    ));

    features.push(caps_feature());

    let ok = features.iter().all(|f| f.available || !f.required);
    Report {
        kernel: kernel_release(),
        features,
        uffd_features: uffd_names,
        xstate_size,
        xfeatures,
        ok,
    }
}

/// ptrace, remote syscalls, process_vm_*, vDSO remapping, probed on a
/// child; returns the XSAVE area size and XCR0.
fn child_features(features: &mut Vec<Feature>) -> (usize, u64) {
    let mut xstate_size = 0;
    let mut xfeatures = 0;
    let (ptrace_ok, remote_ok, vm_ok, vdso_ok, detail) =
        match probe_child(&mut xstate_size, &mut xfeatures) {
            Ok(r) => r,
            Err(e) => (false, false, false, false, e.to_string()),
        };
    features.push(feat(
        "ptrace",
        ptrace_ok,
        true,
        if ptrace_ok {
            format!("seize/interrupt/regsets work; xstate {xstate_size} bytes, xcr0 {xfeatures:#x}")
        } else {
            detail.clone()
        },
        "freezing a process and reading its registers",
        "none: dump and restore need it",
    ));
    features.push(feat(
        "remote-syscalls",
        remote_ok,
        true,
        if remote_ok {
            "a traced child ran getpid/mmap for us".into()
        } else {
            detail.clone()
        },
        "reading signal state, itimers and brk; building the restored process from outside",
        "none",
    ));
    features.push(feat(
        "process_vm_readv/writev",
        vm_ok,
        true,
        if vm_ok {
            "cross-process copies work".into()
        } else {
            detail.clone()
        },
        "fast memory dump",
        "/proc/PID/mem (slower)",
    ));
    features.push(feat(
        "ARCH_MAP_VDSO",
        vdso_ok,
        true,
        if vdso_ok {
            "vDSO re-mapped at a chosen address".into()
        } else {
            detail
        },
        "restoring the vDSO at its saved address",
        "none: restored processes would call a vDSO at the wrong place",
    ));

    (xstate_size, xfeatures)
}

/// userfaultfd and its feature bits; returns the names of the bits.
fn uffd_features(features: &mut Vec<Feature>) -> Vec<&'static str> {
    let mut uffd_names = Vec::new();
    match uffd::create_raw().and_then(|(fd, src)| uffd::api(&fd, 0).map(|f| (f, src))) {
        Ok((f, src)) => {
            uffd_names = uffd::feature_names(f);
            let wp_async =
                f & sys::UFFD_FEATURE_WP_ASYNC != 0 && f & sys::UFFD_FEATURE_WP_UNPOPULATED != 0;
            let events = sys::UFFD_FEATURE_EVENT_FORK
                | sys::UFFD_FEATURE_EVENT_REMAP
                | sys::UFFD_FEATURE_EVENT_REMOVE
                | sys::UFFD_FEATURE_EVENT_UNMAP;
            features.push(feat(
                "userfaultfd",
                f & events == events,
                false,
                format!(
                    "via {src:?}; {} feature bits; fork/remap/remove/unmap events: {}",
                    uffd_names.len(),
                    f & events == events
                ),
                "restore --lazy (missing mode, with the layout events)",
                "full restores only",
            ));
            features.push(feat(
                "uffd-wp-async",
                wp_async,
                false,
                format!(
                    "WP_ASYNC={} WP_UNPOPULATED={}",
                    f & sys::UFFD_FEATURE_WP_ASYNC != 0,
                    f & sys::UFFD_FEATURE_WP_UNPOPULATED != 0
                ),
                "cheap dirty tracking for incremental checkpoints",
                "soft-dirty, else page hashing",
            ));
        }
        Err(e) => {
            features.push(feat(
                "userfaultfd",
                false,
                false,
                e.to_string(),
                "lazy restore, concurrent dumps",
                "full restore; stop-the-world dumps",
            ));
            features.push(feat(
                "uffd-wp-async",
                false,
                false,
                "no userfaultfd".into(),
                "cheap dirty tracking",
                "soft-dirty, else page hashing",
            ));
        }
    }

    uffd_names
}

/// The capabilities stasis needs, from its effective set.
fn caps_feature() -> Feature {
    let caps = effective_caps();
    let names: [(u32, &str); 6] = [
        (sys::CAP_SYS_PTRACE, "CAP_SYS_PTRACE"),
        (sys::CAP_SYS_ADMIN, "CAP_SYS_ADMIN"),
        (sys::CAP_SYS_RESOURCE, "CAP_SYS_RESOURCE"),
        (sys::CAP_NET_ADMIN, "CAP_NET_ADMIN"),
        (sys::CAP_CHECKPOINT_RESTORE, "CAP_CHECKPOINT_RESTORE"),
        (sys::CAP_SETUID, "CAP_SETUID"),
    ];
    let missing: Vec<&str> = names
        .iter()
        .filter(|(b, _)| caps & (1u64 << b) == 0)
        .map(|(_, n)| *n)
        .collect();
    let has = |cap: u32| caps & (1u64 << cap) != 0;
    let core_caps =
        has(sys::CAP_SYS_PTRACE) && (has(sys::CAP_SYS_ADMIN) || has(sys::CAP_CHECKPOINT_RESTORE));
    feat("capabilities", core_caps, true,
        if missing.is_empty() { "all needed capabilities present".into() } else { format!("missing: {}", missing.join(", ")) },
        "tracing any process (CAP_SYS_PTRACE), choosing PIDs (CAP_SYS_ADMIN/CAP_CHECKPOINT_RESTORE), raising rlimits (CAP_SYS_RESOURCE)",
        "without CAP_SYS_RESOURCE, rlimits above stasis's own hard limits and pipes over fs.pipe-max-size cannot be restored")
}

type ChildProbe = (bool, bool, bool, bool, String);

/// Why a probe failed (its message is the feature's detail line).
#[derive(Debug, thiserror::Error)]
enum ProbeError {
    #[error(transparent)]
    Spawn(#[from] crate::child::SpawnError),
    #[error(transparent)]
    Kernel(#[from] crate::KernelError),
    #[error("mmap: {0}")]
    Mmap(std::io::Error),
    #[error("a freshly written page is not soft-dirty: CONFIG_MEM_SOFT_DIRTY is off")]
    NotSoftDirty,
}

fn probe_child(xstate_size: &mut usize, xfeatures: &mut u64) -> Result<ChildProbe, ProbeError> {
    let mut t = spawn_stopped(None)?;
    let pid = t.pid();
    let res = (|| -> Result<ChildProbe, ProbeError> {
        let regs = t.regs()?;
        let xs = t.xstate()?;
        *xstate_size = xs.len();
        *xfeatures = xfeatures_of(&xs);
        let r = t.syscall(&regs, "getpid", libc::SYS_getpid, &[])?;
        let remote_ok = r == crate::sarg(i64::from(pid));
        let page = t.syscall(
            &regs,
            "mmap",
            libc::SYS_mmap,
            &[
                0,
                4096,
                (libc::PROT_READ | libc::PROT_WRITE) as u64,
                (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64,
                u64::MAX,
                0,
            ],
        )?;
        let mem = ProcessMemory::open(pid)?;
        let vm_ok = mem.write(page, b"stasis").is_ok() && {
            let mut b = [0u8; 6];
            mem.read(page, &mut b).is_ok() && &b == b"stasis"
        };
        // Move the vDSO: unmap [vvar..vdso] and ask for it at a new address
        // (a free one: reserve a region, release it, use its start).
        let vdso_ok = match vdso_span(pid) {
            Some((lo, hi)) => {
                let rw = (libc::PROT_READ | libc::PROT_WRITE) as u64;
                let anon = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64;
                let target = t.syscall(
                    &regs,
                    "mmap",
                    libc::SYS_mmap,
                    &[0, 64 * 4096, rw, anon, u64::MAX, 0],
                )?;
                t.syscall(&regs, "munmap", libc::SYS_munmap, &[target, 64 * 4096])?;
                t.syscall(&regs, "munmap", libc::SYS_munmap, &[lo, hi - lo])
                    .is_ok()
                    && t.syscall(
                        &regs,
                        "arch_prctl",
                        libc::SYS_arch_prctl,
                        &[sys::ARCH_MAP_VDSO_64, target],
                    )
                    .is_ok()
                    && vdso_span(pid).map(|(l, _)| l) == Some(target)
            }
            None => false,
        };
        Ok((true, remote_ok, vm_ok, vdso_ok, String::new()))
    })();
    kill_and_reap(t);
    res
}

/// Lowest start and highest end of the `[vvar*]`/`[vdso]` areas of `pid`.
pub fn vdso_span(pid: i32) -> Option<(u64, u64)> {
    crate::procfs::maps(pid)
        .ok()?
        .iter()
        .filter(|m| m.name == "[vdso]" || m.name.starts_with("[vvar"))
        .map(|m| (m.start, m.end))
        .reduce(|(x, y), (a, b)| (x.min(a), y.max(b)))
}

fn probe_pagemap_scan() -> Result<String, ProbeError> {
    let pm = Pagemap::open(std::process::id() as i32)?;
    let buf = vec![1u8; 64 * 4096];
    let start = (buf.as_ptr() as u64).div_ceil(4096) * 4096;
    let r = pm.scan(start, start + 32 * 4096, ScanQuery::private_data())?;
    let pages: u64 = r.iter().map(|x| (x.end - x.start) / 4096).sum();
    drop(buf);
    Ok(format!(
        "found {pages} written pages of 32 in a test buffer"
    ))
}

fn probe_soft_dirty() -> Result<String, ProbeError> {
    let pm = Pagemap::open(std::process::id() as i32)?;
    // SAFETY: anonymous private mapping of one page, unmapped below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(ProbeError::Mmap(last_err()));
    }
    // SAFETY: p is a fresh writable page of ours.
    unsafe { p.cast::<u8>().write_volatile(1) };
    let e = pm.read_entries(p as u64, p as u64 + 4096);
    // SAFETY: unmapping the page mapped above.
    unsafe { libc::munmap(p, 4096) };
    let e = e?;
    if e.first().is_some_and(|v| v & sys::PM_SOFT_DIRTY != 0) {
        Ok("pagemap reports soft-dirty bits".into())
    } else {
        Err(ProbeError::NotSoftDirty)
    }
}

fn probe_clone3_set_tid() -> (bool, String) {
    // Ask for our own PID: EEXIST proves set_tid is understood and allowed.
    let me = [std::process::id() as i32];
    let args = sys::CloneArgs {
        exit_signal: libc::SIGCHLD as u64,
        set_tid: me.as_ptr() as u64,
        set_tid_size: 1,
        ..Default::default()
    };
    // SAFETY: clone3 with set_tid naming an existing PID fails with EEXIST
    // before creating anything; if it unexpectedly succeeds, the child exits at once.
    let r = unsafe { crate::child::clone3(&args) };
    if r == 0 {
        // SAFETY: child side of an unexpected success: leave immediately.
        unsafe { libc::_exit(0) };
    }
    let e = last_err();
    match (r, e.raw_os_error()) {
        (_, Some(libc::EEXIST)) => (true, "clone3 honours set_tid".into()),
        (_, Some(libc::EPERM)) => (
            false,
            "clone3 set_tid needs CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE".into(),
        ),
        (r, _) if r > 0 => (false, "clone3 ignored set_tid".into()),
        _ => (false, format!("clone3: {e}")),
    }
}

fn probe_prctl_mm_map() -> (bool, String) {
    let mut size: u32 = 0;
    // SAFETY: PR_SET_MM_MAP_SIZE writes the struct size to the u32 we pass.
    let r = unsafe {
        libc::prctl(
            sys::PR_SET_MM,
            sys::PR_SET_MM_MAP_SIZE,
            &mut size as *mut u32,
            0,
            0,
        )
    };
    if r < 0 {
        return (
            false,
            format!(
                "PR_SET_MM_MAP_SIZE: {} (kernel without CONFIG_CHECKPOINT_RESTORE?)",
                last_err()
            ),
        );
    }
    (
        size as usize == std::mem::size_of::<sys::PrctlMmMap>(),
        format!("struct prctl_mm_map is {size} bytes"),
    )
}

fn probe_pidfd_getfd() -> (bool, String) {
    let r = pidfd::pidfd_open(std::process::id() as i32)
        .and_then(|p| pidfd::pidfd_getfd(&p, p.as_raw_fd()));
    match r {
        Ok(_) => (true, "works".into()),
        Err(e) => (false, e.to_string()),
    }
}
