//! Rebuild a process from a Stasis image, from the outside, at its saved PID.
//!
//! # The path of a restore
//! 1. Load and check the checkpoint: manifest (verified by `stasis-image`),
//!    CPU features (the image's XCR0 must be a subset of this CPU's), the
//!    saved PID is free (waiting out a zombie that init reaps late).
//! 2. **Stub**: `clone3` with `set_tid` creates a child at the saved PID; it
//!    stops itself under our trace (`PTRACE_O_EXITKILL`: if stasis dies, so
//!    does the half-built process). Every signal is blocked.
//! 3. **Control page**: a small RWX area is mapped at an address free in
//!    both the stub's and the image's layout; it holds a `syscall`
//!    instruction and scratch space for arguments. From now on every remote
//!    syscall runs there.
//! 4. **Clean slate**: everything else is unmapped (the stub was a copy of
//!    stasis), all fds are closed, and the vDSO is mapped at its saved
//!    address with `ARCH_MAP_VDSO_64`.
//! 5. **Memory**: each saved area is mapped at its address (file mappings by
//!    path) and filled by `preadv` *inside the process* straight from the
//!    page pack (one kernel copy, no bounce through stasis), while a thread of
//!    stasis verifies every pack checksum in parallel.
//! 6. **The rest**: `PR_SET_MM_MAP` (brk, arg/env, auxv, exe), cwd, umask,
//!    personality, session, fds, rlimits, comm, signal handlers, sigaltstack,
//!    credentials, pending signals (queued by the process to itself so kernel
//!    siginfo is allowed), interval timers, the XSAVE area and the mask.
//! 7. **Jump**: if verification passed, the last remote syscall unmaps the
//!    control page; at its syscall-exit stop the saved registers are loaded
//!    and the process is detached. Any failure before this kills the stub:
//!    nothing half-restored is left running.

pub mod build;
pub mod remote;

use std::time::{Duration, Instant};

use stasis_image::manifest::{ProcessImage, VmaKind};
use stasis_image::{Checkpoint, ImageDir, ImageError, PackReader};
use stasis_kernel::child::{kill_and_reap, spawn_stopped, SpawnError};
use stasis_kernel::mem::ProcessMemory;
use stasis_kernel::{sarg, KernelError, Tracee, UserRegs};
use stasis_sys as sys;

use crate::remote::Remote;

/// Errors of a restore. After any of them no restored process is left.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error(transparent)]
    Image(#[from] ImageError),
    #[error("PID {pid} is in use by a running process ({by}): stop it first, then restore again")]
    PidTaken { pid: i32, by: String },
    #[error("PID {pid} is still held by a zombie after {waited:?}: its parent has not reaped it; wait or reap it, then restore again")]
    PidZombie { pid: i32, waited: Duration },
    #[error("restoring at PID {pid} is not permitted (run stasis as root)")]
    NoPermission {
        pid: i32,
        #[source]
        source: std::io::Error,
    },
    #[error("this image cannot be restored here: {0}")]
    Incompatible(String),
    #[error("this version of stasis cannot restore the image: {0}")]
    Unsupported(String),
    #[error("cannot open {path} ({what}); the file must exist at the same path as at dump time")]
    File {
        path: String,
        what: String,
        #[source]
        source: KernelError,
    },
    #[error("restore step failed: {what}")]
    Step {
        what: String,
        #[source]
        source: KernelError,
    },
    #[error("memory layout could not be rebuilt: {0}")]
    Layout(String),
    #[error("the image is corrupt: {0}; the restore was abandoned and nothing was started")]
    Corrupt(ImageError),
    #[error("the image is inconsistent: {0}; the restore was abandoned and nothing was started")]
    Inconsistent(String),
    #[error(transparent)]
    Kernel(#[from] KernelError),
}

type Result<T, E = RestoreError> = std::result::Result<T, E>;

/// What to restore and how.
pub struct RestoreOptions {
    /// Checkpoint number; `None` = latest.
    pub checkpoint: Option<u32>,
    /// How long to wait for a zombie holding the PID to be reaped.
    pub pid_wait: Duration,
    /// Called with (bytes restored, bytes to restore).
    pub progress: Option<Box<dyn Fn(u64, u64) + Send>>,
}

impl Default for RestoreOptions {
    fn default() -> Self {
        Self {
            checkpoint: None,
            pid_wait: Duration::from_secs(10),
            progress: None,
        }
    }
}

/// A restored, running process (a child of the caller).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Restored {
    pub checkpoint: u32,
    pub pid: i32,
    pub pages: u64,
    pub bytes: u64,
    pub total_us: u64,
    /// Part of `total_us` spent waiting for a zombie to release the PID.
    pub pid_wait_us: u64,
}

fn micros(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_micros()).unwrap_or(u64::MAX)
}

/// Size of the control area: one code page and scratch pages.
const CTL_SIZE: u64 = 8 * 4096;
const TASK_TOP: u64 = 0x7fff_ffff_f000;

/// The stub being turned into the restored process: its threads (the
/// main one first, the others as they are created), and which of them runs
/// the next remote syscall.
struct Stub {
    t: Tracee,
    base: UserRegs,
    threads: Vec<(Tracee, UserRegs)>,
    /// `None`: the main thread; `Some(i)`: `threads[i]`.
    cur: Option<usize>,
    mem: ProcessMemory,
    ctl: u64,
}

impl Stub {
    /// Kills the whole half-built process and reaps it.
    fn kill(self) {
        for (mut t, _) in self.threads {
            t.forget();
        }
        kill_and_reap(self.t);
    }
}

impl Remote for Stub {
    fn sys(&mut self, name: &'static str, nr: i64, args: &[u64]) -> Result<u64, KernelError> {
        match self.cur {
            None => self.t.syscall(&self.base, name, nr, args),
            Some(i) => {
                let (t, base) = &mut self.threads[i];
                t.syscall(base, name, nr, args)
            }
        }
    }
    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), KernelError> {
        self.mem.write(addr, data)
    }
    fn scratch(&self) -> u64 {
        self.ctl + 4096
    }
    fn scratch_len(&self) -> usize {
        usize::try_from(CTL_SIZE - 4096).unwrap_or(0)
    }
}

/// Waits until `pid` is free: returns at once if it is, waits out a zombie
/// (this machine's init reaps orphans late) up to `wait`, and refuses a
/// live process.
pub fn wait_pid_free(pid: i32, wait: Duration) -> Result<()> {
    let t0 = Instant::now();
    loop {
        let stat = match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Ok(s) => s,
            Err(_) => return Ok(()),
        };
        let state = stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].split_whitespace().next())
            .unwrap_or("?");
        if state != "Z" && state != "X" {
            let comm = stat
                .find('(')
                .zip(stat.rfind(')'))
                .map(|(a, b)| stat[a + 1..b].to_string())
                .unwrap_or_default();
            return Err(RestoreError::PidTaken { pid, by: comm });
        }
        if t0.elapsed() >= wait {
            return Err(RestoreError::PidZombie { pid, waited: wait });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Loads a checkpoint and checks that this version can restore it here.
pub fn load(store: &ImageDir, n: Option<u32>) -> Result<Checkpoint> {
    let cp = store.load(n)?;
    let m = &cp.manifest;
    if m.processes.len() != 1 {
        return Err(RestoreError::Unsupported(format!(
            "checkpoint {} holds {} processes; this version restores one",
            cp.number,
            m.processes.len()
        )));
    }
    let p = &m.processes[0];
    if p.threads.is_empty() {
        return Err(RestoreError::Inconsistent(format!("process {} has no threads", p.pid)));
    }
    if m.parent.is_some() {
        return Err(RestoreError::Unsupported(format!(
            "checkpoint {} is incremental; this version restores full checkpoints only",
            cp.number
        )));
    }
    if m.host.page_size != sys::PAGE_SIZE {
        return Err(RestoreError::Incompatible(format!(
            "image page size {} differs from {}",
            m.host.page_size,
            sys::PAGE_SIZE
        )));
    }
    Ok(cp)
}

/// Restores the (single) process of a checkpoint and lets it run.
pub fn restore(store: &ImageDir, opts: &RestoreOptions) -> Result<Restored> {
    let t0 = Instant::now();
    let cp = load(store, opts.checkpoint)?;
    let p = &cp.manifest.processes[0];
    let pack = match &p.pack {
        Some(r) => Some(cp.open_pack(r)?),
        None => None,
    };
    let waited = Instant::now();
    wait_pid_free(p.pid, opts.pid_wait)?;
    let pid_wait_us = micros(waited);

    let t = spawn_stopped(Some(p.pid)).map_err(|e| match e {
        SpawnError::PidTaken(pid) => RestoreError::PidTaken {
            pid,
            by: "a process that appeared meanwhile".into(),
        },
        SpawnError::NoPermission { pid, source } => RestoreError::NoPermission { pid, source },
        SpawnError::Kernel(k) => RestoreError::Kernel(k),
    })?;
    let pid = t.pid();
    let mem = match ProcessMemory::open(pid) {
        Ok(m) => m,
        Err(e) => {
            kill_and_reap(t);
            return Err(e.into());
        }
    };
    let mut base = match t.regs() {
        Ok(r) => r,
        Err(e) => {
            kill_and_reap(t);
            return Err(e.into());
        }
    };
    // The stub's own stack pointer must not look like it is on the
    // restored sigaltstack (sigaltstack() would refuse).
    base.rsp = 0;
    let mut stub = Stub {
        t,
        base,
        threads: Vec::new(),
        cur: None,
        mem,
        ctl: 0,
    };

    // Verify pack checksums in parallel with the memory fill.
    let verifier = pack.as_ref().map(|pk| {
        let path = pk.path().to_path_buf();
        let pref = p.pack.clone();
        std::thread::spawn(move || PackReader::open(&path, pref.as_ref()).and_then(|r| r.verify()))
    });

    let built = build_process(&mut stub, &cp, p, pack.as_ref(), opts);
    let verified = match verifier.map(|h| h.join()) {
        None => Ok(()),
        Some(Ok(r)) => r.map_err(RestoreError::Corrupt),
        Some(Err(_)) => Err(RestoreError::Layout(
            "the checksum verifier panicked".into(),
        )),
    };
    let result = built
        .and_then(|bytes| verified.map(|()| bytes))
        .and_then(|bytes| {
            jump(&mut stub, p)?;
            Ok(bytes)
        });
    match result {
        Ok(bytes) => Ok(Restored {
            checkpoint: cp.number,
            pid,
            pages: bytes / sys::PAGE_SIZE,
            bytes,
            total_us: micros(t0),
            pid_wait_us,
        }),
        Err(e) => {
            stub.kill();
            Err(e)
        }
    }
}

fn step(what: impl Into<String>) -> impl FnOnce(KernelError) -> RestoreError {
    let what = what.into();
    move |source| RestoreError::Step { what, source }
}

fn read_maps(pid: i32) -> Result<Vec<(u64, u64, String)>> {
    let text =
        std::fs::read_to_string(format!("/proc/{pid}/maps")).map_err(|e| KernelError::Io {
            what: format!("reading /proc/{pid}/maps"),
            source: e,
        })?;
    Ok(text
        .lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let (a, b) = it.next()?.split_once('-')?;
            let name = it.nth(4).unwrap_or("").to_string();
            Some((
                u64::from_str_radix(a, 16).ok()?,
                u64::from_str_radix(b, 16).ok()?,
                name,
            ))
        })
        .collect())
}

/// Everything up to (not including) the final jump. Returns bytes filled.
fn build_process(
    s: &mut Stub,
    cp: &Checkpoint,
    p: &ProcessImage,
    pack: Option<&PackReader>,
    opts: &RestoreOptions,
) -> Result<u64> {
    let pid = s.t.pid();
    if p.threads.len() > 1 {
        s.t.set_options(sys::PTRACE_O_EXITKILL | sys::PTRACE_O_TRACECLONE).map_err(step("tracing thread creation"))?;
    }
    s.t.set_sigmask(!0)
        .map_err(step("blocking signals in the stub"))?;

    // CPU features: the image may only use what this CPU has.
    let cpu_x = stasis_kernel::probe::xfeatures_of(&s.t.xstate()?);
    let img_x = cp.manifest.host.xfeatures;
    if img_x & !cpu_x != 0 {
        return Err(RestoreError::Incompatible(format!(
            "the image uses CPU state components {:#x} that this CPU lacks (it has {cpu_x:#x})",
            img_x & !cpu_x
        )));
    }

    // Control area, free in both layouts.
    let mut busy: Vec<(u64, u64)> = read_maps(pid)?.iter().map(|m| (m.0, m.1)).collect();
    busy.extend(p.vmas.iter().map(|v| (v.start, v.end)));
    let ctl = build::find_gap(&busy, CTL_SIZE)
        .ok_or_else(|| RestoreError::Layout("no free address range for the control page".into()))?;
    let rwx = (libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC) as u64;
    let fl = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE) as u64;
    let got = s
        .sys(
            "mmap",
            libc::SYS_mmap,
            &[ctl, CTL_SIZE, rwx, fl, u64::MAX, 0],
        )
        .map_err(step("mapping the control page"))?;
    if got != ctl {
        return Err(RestoreError::Layout(format!(
            "control page landed at {got:#x}, not {ctl:#x}"
        )));
    }
    s.mem
        .write(ctl, &[0x0f, 0x05, 0xcc])
        .map_err(step("writing the syscall instruction"))?;
    s.t.set_syscall_insn(ctl);
    s.ctl = ctl;

    // The stub inherited stasis's rseq registration; its area is about to
    // be unmapped, and the kernel would fault writing to it.
    if let Some(c) = s.t.rseq_config()? {
        s.sys(
            "rseq",
            libc::SYS_rseq,
            &[
                c.rseq_abi_pointer,
                u64::from(c.rseq_abi_size),
                sys::RSEQ_FLAG_UNREGISTER,
                u64::from(c.signature),
            ],
        )
        .map_err(step("unregistering the stub's rseq area"))?;
    }

    // Clean slate: no mappings but the control area, no fds.
    s.sys("munmap", libc::SYS_munmap, &[0, ctl])
        .map_err(step("unmapping the stub below the control page"))?;
    s.sys(
        "munmap",
        libc::SYS_munmap,
        &[ctl + CTL_SIZE, TASK_TOP - ctl - CTL_SIZE],
    )
    .map_err(step("unmapping the stub above the control page"))?;
    s.sys(
        "close_range",
        sys::SYS_CLOSE_RANGE,
        &[0, u64::from(u32::MAX), 0],
    )
    .map_err(step("closing the stub's fds"))?;

    // vDSO at its saved address.
    restore_vdso(s, p)?;

    // Memory.
    let total: u64 = pack.map(|pk| pk.pages() * sys::PAGE_SIZE).unwrap_or(0);
    let mut filled = 0u64;
    let pack_fd = match pack {
        Some(pk) => {
            let path = pk.path().to_string_lossy().into_owned();
            let a = s
                .put_cstr(build::SCRATCH_PATH, &path)
                .map_err(step("pack path"))?;
            s.sys(
                "open",
                libc::SYS_open,
                &[a, (libc::O_RDONLY | libc::O_CLOEXEC) as u64, 0],
            )
            .map_err(|source| RestoreError::File {
                path,
                what: "page pack".into(),
                source,
            })?
        }
        None => u64::MAX,
    };
    let mut last = Instant::now();
    for v in &p.vmas {
        let runs = pack
            .map(|pk| build::clip_runs(pk.runs(), v.start, v.end))
            .unwrap_or_default();
        filled += build::map_vma(s, v, &runs, pack_fd)?;
        if let Some(cb) = &opts.progress {
            if last.elapsed() >= Duration::from_millis(100) {
                cb(filled, total);
                last = Instant::now();
            }
        }
    }
    if let Some(cb) = &opts.progress {
        cb(filled, total);
    }
    if pack.is_some() {
        s.sys("close", libc::SYS_close, &[pack_fd])
            .map_err(step("closing the pack"))?;
    }
    if filled != total {
        return Err(RestoreError::Inconsistent(format!(
            "{} pack bytes lie outside every saved area",
            total - filled
        )));
    }

    // mm fields, with the exe file. The kernel refuses to switch the exe
    // link away from a file that is still mapped, so when the stub already
    // runs the same file (a stasis binary restoring a stasis workload) the
    // link is left as it is.
    let same_exe = {
        use std::os::unix::fs::MetadataExt;
        let cur = std::fs::metadata(format!("/proc/{pid}/exe")).ok();
        let want = std::fs::metadata(&p.exe).ok();
        matches!((cur, want), (Some(a), Some(b)) if a.dev() == b.dev() && a.ino() == b.ino())
    };
    if same_exe {
        build::restore_mm(s, &p.mm, u64::from(u32::MAX))?;
    } else {
        let exe = s
            .put_cstr(build::SCRATCH_PATH, &p.exe)
            .map_err(step("exe path"))?;
        let exe_fd = s
            .sys(
                "open",
                libc::SYS_open,
                &[exe, (libc::O_RDONLY | libc::O_CLOEXEC) as u64, 0],
            )
            .map_err(|source| RestoreError::File {
                path: p.exe.clone(),
                what: "the executable".into(),
                source,
            })?;
        let mm_res = build::restore_mm(s, &p.mm, exe_fd);
        s.sys("close", libc::SYS_close, &[exe_fd])
            .map_err(step("closing the exe fd"))?;
        mm_res?;
    }

    // Process attributes.
    let cwd = s
        .put_cstr(build::SCRATCH_PATH, &p.cwd)
        .map_err(step("cwd path"))?;
    s.sys("chdir", libc::SYS_chdir, &[cwd])
        .map_err(|source| RestoreError::File {
            path: p.cwd.clone(),
            what: "working directory".into(),
            source,
        })?;
    s.sys("umask", libc::SYS_umask, &[u64::from(p.umask)])
        .map_err(step("umask"))?;
    s.sys(
        "personality",
        libc::SYS_personality,
        &[u64::from(p.personality)],
    )
    .map_err(step("personality"))?;
    if p.sid == p.pid {
        s.sys("setsid", libc::SYS_setsid, &[])
            .map_err(step("becoming a session leader"))?;
    } else if p.pgid == p.pid {
        s.sys("setpgid", libc::SYS_setpgid, &[0, 0])
            .map_err(step("becoming a process group leader"))?;
    }
    build::restore_fds(s, &p.fds)?;
    for rl in &p.rlimits {
        let a = s
            .put(build::SCRATCH_STRUCT, &build::words(&[rl.soft, rl.hard]))
            .map_err(step("rlimit"))?;
        if let Err(e) = s.sys(
            "prlimit64",
            libc::SYS_prlimit64,
            &[0, u64::from(rl.resource), a, 0],
        ) {
            tracing::warn!(
                pid,
                "could not restore rlimit {} ({}/{}): {e}",
                rl.resource,
                rl.soft,
                rl.hard
            );
        }
    }
    // Signals.
    build::restore_sigactions(s, &p.sigactions)?;

    // Threads, while stasis may still choose TIDs (set_tid needs
    // CAP_SYS_ADMIN, which credentials below may drop).
    for th in &p.threads[1..] {
        s.cur = None;
        let tid = build::clone_thread(s, th.tid)?;
        let tid = i32::try_from(tid).map_err(|_| RestoreError::Layout(format!("bad tid {tid}")))?;
        let mut t = Tracee::adopt_new_thread(tid).map_err(step(format!("taking over new thread {tid}")))?;
        t.set_syscall_insn(s.ctl);
        let mut base = t.regs().map_err(step(format!("registers of new thread {tid}")))?;
        base.rsp = 0;
        s.threads.push((t, base));
    }
    // Per-thread state, credentials (per thread in the kernel) and
    // thread-directed pending signals, each run by the thread itself (a
    // thread may queue kernel-style siginfo only to itself).
    for (i, th) in p.threads.iter().enumerate() {
        s.cur = i.checked_sub(1);
        build::thread_state(s, th)?;
        restore_creds(s, p)?;
        for si in &th.pending {
            let a = s.put(build::SCRATCH_STRUCT, &si.raw).map_err(step("siginfo"))?;
            s.sys("rt_tgsigqueueinfo", libc::SYS_rt_tgsigqueueinfo, &[sarg(i64::from(pid)), sarg(i64::from(th.tid)), u64::from(si.signo), a])
                .map_err(step(format!("queueing pending signal {} of thread {}", si.signo, th.tid)))?;
        }
    }
    s.cur = None;
    for si in &p.shared_pending {
        let a = s.put(build::SCRATCH_STRUCT, &si.raw).map_err(step("siginfo"))?;
        s.sys("rt_sigqueueinfo", libc::SYS_rt_sigqueueinfo, &[sarg(i64::from(pid)), u64::from(si.signo), a])
            .map_err(step(format!("queueing pending signal {}", si.signo)))?;
    }
    build::restore_itimers(s, &p.itimers)?;
    Ok(filled)
}

fn restore_vdso(s: &mut Stub, p: &ProcessImage) -> Result<()> {
    let find = |k: fn(&VmaKind) -> bool| p.vmas.iter().find(|v| k(&v.kind));
    let Some(vdso) = find(|k| matches!(k, VmaKind::Vdso)) else {
        return Ok(());
    };
    let vvar = find(|k| matches!(k, VmaKind::Vvar));
    let start = vvar.map_or(vdso.start, |v| v.start);
    s.sys(
        "arch_prctl",
        libc::SYS_arch_prctl,
        &[sys::ARCH_MAP_VDSO_64, start],
    )
    .map_err(step("mapping the vDSO"))?;
    let now = read_maps(s.t.pid())?;
    let placed = |name: &str, want: Option<&stasis_image::manifest::Vma>| match want {
        None => true,
        Some(w) => now
            .iter()
            .any(|m| m.2 == name && m.0 == w.start && m.1 == w.end),
    };
    let vclock = find(|k| matches!(k, VmaKind::VvarVclock));
    if !(placed("[vdso]", Some(vdso)) && placed("[vvar]", vvar) && placed("[vvar_vclock]", vclock))
    {
        return Err(RestoreError::Incompatible(
            "this kernel's vDSO layout differs from the one in the image (it was dumped under another kernel); restore on the kernel that made it".into(),
        ));
    }
    Ok(())
}

fn restore_creds(s: &mut Stub, p: &ProcessImage) -> Result<()> {
    let c = &p.creds;
    if c.uid == [0; 4] && c.gid == [0; 4] && c.groups.is_empty() {
        return Ok(());
    }
    let groups: Vec<u8> = c.groups.iter().flat_map(|g| g.to_le_bytes()).collect();
    let a = s
        .put(build::SCRATCH_STRUCT, &groups)
        .map_err(step("groups"))?;
    s.sys(
        "setgroups",
        libc::SYS_setgroups,
        &[c.groups.len() as u64, a],
    )
    .map_err(step("setgroups"))?;
    s.sys(
        "setresgid",
        libc::SYS_setresgid,
        &[
            u64::from(c.gid[0]),
            u64::from(c.gid[1]),
            u64::from(c.gid[2]),
        ],
    )
    .map_err(step("setresgid"))?;
    s.sys("setfsgid", libc::SYS_setfsgid, &[u64::from(c.gid[3])])
        .map_err(step("setfsgid"))?;
    s.sys(
        "setresuid",
        libc::SYS_setresuid,
        &[
            u64::from(c.uid[0]),
            u64::from(c.uid[1]),
            u64::from(c.uid[2]),
        ],
    )
    .map_err(step("setresuid"))?;
    s.sys("setfsuid", libc::SYS_setfsuid, &[u64::from(c.uid[3])])
        .map_err(step("setfsuid"))?;
    Ok(())
}

/// Final step: xstate and mask, unmap the control page, load the saved
/// registers at the syscall-exit stop and detach.
fn jump(s: &mut Stub, p: &ProcessImage) -> Result<()> {
    let regs_of = |th: &stasis_image::manifest::ThreadImage| {
        UserRegs::from_words(&th.regs).ok_or_else(|| RestoreError::Inconsistent(format!("thread {} has {} register words", th.tid, th.regs.len())))
    };
    // Other threads: state loaded now, released after the control page is gone.
    for ((t, _), th) in s.threads.iter_mut().zip(&p.threads[1..]) {
        let regs = regs_of(th)?;
        t.set_xstate(&th.xstate).map_err(step(format!("restoring FPU/SSE/AVX state of thread {}", th.tid)))?;
        t.set_sigmask(th.sigmask).map_err(step(format!("restoring the signal mask of thread {}", th.tid)))?;
        t.set_regs(&regs).map_err(step(format!("loading the registers of thread {}", th.tid)))?;
    }
    let th = &p.threads[0];
    let regs = UserRegs::from_words(&th.regs).ok_or_else(|| {
        RestoreError::Inconsistent(format!(
            "thread {} has {} register words",
            th.tid,
            th.regs.len()
        ))
    })?;
    s.t.set_xstate(&th.xstate)
        .map_err(step("restoring FPU/SSE/AVX state"))?;
    // Unmap the control page with every signal still blocked (an armed
    // timer may have fired); its syscall-exit stop is where the process gets
    // its own mask and registers back (the instruction after `syscall` is gone).
    s.sys("munmap", libc::SYS_munmap, &[s.ctl, CTL_SIZE])
        .map_err(step("unmapping the control page"))?;
    s.t.set_sigmask(th.sigmask)
        .map_err(step("restoring the signal mask"))?;
    s.t.set_regs(&regs)
        .map_err(step("loading the saved registers"))?;
    s.t.detach().map_err(step("detaching"))?;
    for (t, _) in &mut s.threads {
        t.detach().map_err(step("detaching a thread"))?;
    }
    Ok(())
}
