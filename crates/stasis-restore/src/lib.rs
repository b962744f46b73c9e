//! Rebuild a process tree from a Stasis image, from the outside, at its
//! saved PIDs.
//!
//! # The path of a restore
//! 1. **Load and check** the checkpoint: manifest (verified by
//!    `stasis-image`), the tree's shape ([`tree::plan`]), CPU features (the
//!    image's XCR0 must be a subset of this CPU's), every saved PID and TID
//!    free (waiting out zombies that init reaps late).
//! 2. **Root stub**: `clone3` with `set_tid` creates a child of stasis at the
//!    root's PID; it stops itself under our trace (`PTRACE_O_EXITKILL`: if
//!    stasis dies, so does the half-built tree). Every signal is blocked. It
//!    inherits one end of a datagram socket (the fd transport of [`files`]).
//! 3. **Control page**: a small RWX area at an address free in the stub's
//!    and in every image process's layout holds a `syscall` instruction and
//!    scratch space. Every remote syscall runs there.
//! 4. **Clean slate**: the stub's rseq area is unregistered, everything but
//!    the control page is unmapped, every fd but the transport is closed.
//! 5. **The tree**: each process is forked by its parent (`clone3` with
//!    `set_tid`, auto-attached by `PTRACE_O_TRACEFORK`) from that clean
//!    slate; session leaders call `setsid()` at once; process groups are set
//!    once all exist ([`tree`]).
//! 6. **Per process**: vDSO at its address (`ARCH_MAP_VDSO_64`); memory
//!    mapped and filled by `preadv` *inside the process* straight from the
//!    page pack (shared anonymous memory is mapped by later processes through
//!    `/proc/PID/map_files` of the first, so it stays shared); mm fields;
//!    cwd, umask, personality; fds handed over from the restorer's
//!    [`files::FdFactory`]; epoll registrations; rlimits; signal handlers;
//!    threads (`clone3` with `set_tid`); per-thread state; credentials;
//!    pending signals; interval timers. Zombies are made to exit with their
//!    saved status. Meanwhile a thread of stasis verifies every pack checksum.
//! 7. **Jump**: if verification passed, each process (children first) gets
//!    its threads' registers back; its last remote syscall unmaps the control
//!    page, and at that syscall-exit stop the main thread's registers are
//!    loaded. Once every process is ready, all are detached in one short
//!    loop (the root last). Any failure before this kills the whole
//!    half-built tree and reaps every task of it (the restorer is a child
//!    subreaper meanwhile) before the error is returned: nothing is left
//!    running, no zombie holds a saved PID. A restorer killed before the
//!    detach loop takes the stopped tree with it (`PTRACE_O_EXITKILL`).

pub mod build;
pub mod files;
/// The kernel seam restore decides over (moved to `stasis_kernel::remote`).
pub use stasis_kernel::remote;
pub mod sysv;
pub mod tree;

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use stasis_image::manifest::{ProcessImage, VmaKind};
use stasis_image::{Checkpoint, ImageDir, ImageError, PackReader, PageSource, RunEntry};
use stasis_kernel::child::{spawn_stopped, SpawnError};
use stasis_kernel::mem::ProcessMemory;
use stasis_kernel::{sarg, scm, KernelError, Tracee, UserRegs};
use stasis_sys as sys;

use crate::build::step;
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
    #[error("port {port} of fd {fd} is taken by another process: stop it (or free the port), then restore again")]
    PortTaken { fd: i32, port: u16 },
    #[error("fd {fd}: cannot take back its {what}: the file is locked by another process; stop it, then restore again")]
    Locked {
        fd: i32,
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("socket step failed: {what}")]
    Socket {
        what: String,
        #[source]
        source: std::io::Error,
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

/// Receives the userfaultfd of each lazily restored process
/// (`restore --lazy`): from the moment it is handed over, something must
/// serve its faults, since the restore itself goes on touching the process
/// (rseq, signal frames).
pub trait LazySink: Send + Sync {
    /// userfaultfd features to ask for.
    fn features(&self) -> u64;
    /// `uffd` was created in process `pid` (image PID `image_pid`) and
    /// `areas` are registered with it in missing mode, unfilled.
    fn hand(
        &self,
        image_pid: i32,
        pid: i32,
        areas: &[(u64, u64)],
        uffd: &OwnedFd,
    ) -> Result<(), String>;
}

/// Whether a lazy restore leaves area `v` to the filler: private anonymous
/// memory only (a userfaultfd in missing mode cannot serve private file
/// mappings, and shared memory is filled once for every process).
pub fn lazy_area(v: &stasis_image::manifest::Vma) -> bool {
    matches!(v.kind, VmaKind::Anon) && !v.shared && v.shm.is_none()
}

/// What to restore and how.
pub struct RestoreOptions {
    /// Checkpoint number; `None` = latest.
    pub checkpoint: Option<u32>,
    /// How long to wait for a zombie holding a PID to be reaped.
    pub pid_wait: Duration,
    /// Called with (bytes restored, bytes to restore).
    pub progress: Option<Box<dyn Fn(u64, u64) + Send>>,
    /// Restore into a new PID namespace (when the saved PIDs are taken here).
    pub new_pidns: bool,
    /// Lazy restore: private anonymous memory is left to this sink's filler.
    pub lazy: Option<Box<dyn LazySink>>,
}

impl Default for RestoreOptions {
    fn default() -> Self {
        Self {
            checkpoint: None,
            pid_wait: Duration::from_secs(10),
            progress: None,
            new_pidns: false,
            lazy: None,
        }
    }
}

/// A restored, running tree (its root is a child of the caller).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Restored {
    pub checkpoint: u32,
    /// PID of the root process (as seen from where stasis runs).
    pub pid: i32,
    /// With `--new-pidns`: the root's PID inside its namespace (the saved one).
    pub pid_in_namespace: Option<i32>,
    /// With `--new-pidns`: the namespace's init (a child of the caller; it
    /// exits with the root's status).
    pub init_pid: Option<i32>,
    pub processes: usize,
    pub threads: usize,
    pub pages: u64,
    pub bytes: u64,
    /// Of `bytes`, those left to the lazy filler.
    pub lazy_bytes: u64,
    pub total_us: u64,
    /// Part of `total_us` spent waiting for zombies to release PIDs.
    pub pid_wait_us: u64,
}

fn micros(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_micros()).unwrap_or(u64::MAX)
}

/// Size of the control area: one code page and scratch pages.
const CTL_SIZE: u64 = 8 * 4096;
const TASK_TOP: u64 = 0x7fff_ffff_f000;

/// One process being rebuilt: its threads (the main one first, the others
/// as they are created), and which of them runs the next remote syscall.
struct Proc {
    pid: i32,
    t: Tracee,
    base: UserRegs,
    threads: Vec<(Tracee, UserRegs)>,
    /// `None`: the main thread; `Some(i)`: `threads[i]`.
    cur: Option<usize>,
    mem: ProcessMemory,
    ctl: u64,
    /// Whether the process still exists as a traced stub (zombies exit).
    live: bool,
}

impl Remote for Proc {
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
    fn read(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), KernelError> {
        self.mem.read(addr, buf)
    }
    fn scratch(&self) -> u64 {
        self.ctl + 4096
    }
    fn scratch_len(&self) -> usize {
        usize::try_from(CTL_SIZE - 4096).unwrap_or(0)
    }
}

impl Proc {
    /// `pid` is the process's PID in its own namespace (the image's);
    /// `t.pid()` is the same process as stasis sees it.
    fn adopt(t: Tracee, ctl: u64, pid: i32) -> Result<Self> {
        let mem = ProcessMemory::open(t.pid())?;
        let mut base = t.regs()?;
        // The stub's own stack pointer must not look like it is on the
        // restored sigaltstack (sigaltstack() would refuse).
        base.rsp = 0;
        let mut p = Proc {
            pid,
            t,
            base,
            threads: Vec::new(),
            cur: None,
            mem,
            ctl,
            live: true,
        };
        if ctl != 0 {
            p.t.set_syscall_insn(ctl);
        }
        Ok(p)
    }
}

/// How long a failed restore waits for the half-built tree it killed to be
/// reaped (a few milliseconds in practice).
const REAP_WAIT: Duration = Duration::from_secs(5);

/// Kills every process of a half-built tree (and the PID namespace's init
/// `init`, if any) and reaps all of their tasks: the threads and processes
/// it traces must be reaped by the restorer itself (a traced thread that
/// died is a zombie until its tracer waits for it, and the root cannot be
/// reaped before its threads), and with the restorer a subreaper the
/// orphaned processes come to it too. Bounded by [`REAP_WAIT`].
fn kill_tree(procs: Vec<Proc>, init: Option<i32>) {
    let mut pids = Vec::with_capacity(procs.len() + 1);
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

/// While a tree is being built: reaps the dead non-leader threads of
/// every process under the restorer, so that a process killed from outside
/// (`kill -9`, the OOM killer, a lazy filler that found a damaged page)
/// makes the remote syscall waiting on it fail at once instead of waiting
/// forever for a leader whose exit the kernel holds back until its traced
/// threads are reaped (see `stasis_kernel::child::reap_dead_threads`).
struct Watchdog {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watchdog {
    fn start() -> Watchdog {
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
    let mut out = Vec::new();
    let mut queue = vec![std::process::id() as i32];
    while let Some(p) = queue.pop() {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) else {
            continue;
        };
        for t in tasks.flatten() {
            let kids = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
            for k in kids
                .split_whitespace()
                .filter_map(|x| x.parse::<i32>().ok())
            {
                if !out.contains(&k) {
                    out.push(k);
                    queue.push(k);
                }
            }
        }
    }
    out
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
pub fn load(store: &ImageDir, n: Option<u32>) -> Result<(Checkpoint, tree::Plan)> {
    let cp = store.load(n)?;
    let m = &cp.manifest;
    if m.host.page_size != sys::PAGE_SIZE {
        return Err(RestoreError::Incompatible(format!(
            "image page size {} differs from {}",
            m.host.page_size,
            sys::PAGE_SIZE
        )));
    }
    for p in &m.processes {
        if p.zombie.is_none() && p.threads.is_empty() {
            return Err(RestoreError::Inconsistent(format!(
                "process {} has no threads",
                p.pid
            )));
        }
    }
    let plan = tree::plan(&m.processes).map_err(RestoreError::Unsupported)?;
    Ok((cp, plan))
}

/// Restores the process tree of a checkpoint and lets it run.
pub fn restore(store: &ImageDir, opts: &RestoreOptions) -> Result<Restored> {
    let t0 = Instant::now();
    // Processes of a tree abandoned half-built come back to us to be
    // reaped at once (not to an init that reaps late, keeping their PIDs).
    let _reaper = stasis_kernel::child::Subreaper::enable();
    let (cp, plan) = load(store, opts.checkpoint)?;
    let m = &cp.manifest;
    // The pages of each process: its own pack, and for an incremental
    // checkpoint the packs of its ancestors.
    let chain = stasis_image::load_chain(store, Some(cp.number))?;
    let mut packs = Vec::new();
    for p in &m.processes {
        packs.push(if p.zombie.is_some() {
            Vec::new()
        } else {
            stasis_image::page_sources(&chain, p)?
        });
    }
    let waited = Instant::now();
    for p in m.processes.iter().filter(|_| !opts.new_pidns) {
        wait_pid_free(p.pid, opts.pid_wait)?;
        for th in p.threads.iter().filter(|t| t.tid != p.pid) {
            wait_pid_free(th.tid, opts.pid_wait)?;
        }
    }
    let pid_wait_us = micros(waited);

    // The fd transport: the stub inherits `remote_end` at a number above
    // every fd of the image.
    let (transport, remote_end) = scm::dgram_pair()?;
    let max_fd = m
        .processes
        .iter()
        .flat_map(|p| p.fds.iter().map(|f| f.fd))
        .max()
        .unwrap_or(2);
    let remote_end = scm::dup_at_least(remote_end.as_fd(), max_fd.max(2) + 1)?;
    let h = u64::from(remote_end.as_raw_fd().unsigned_abs());

    let root = &m.processes[0];
    let spawn_err = |e| match e {
        SpawnError::PidTaken(pid) => RestoreError::PidTaken {
            pid,
            by: "a process that appeared meanwhile".into(),
        },
        SpawnError::NoPermission { pid, source } => RestoreError::NoPermission { pid, source },
        SpawnError::Kernel(k) => RestoreError::Kernel(k),
    };
    let (t, init) = if opts.new_pidns {
        // The namespace's init is stasis exec'd anew: keep the transport
        // across that exec, so the root stub (forked by init) has it.
        // SAFETY: clearing FD_CLOEXEC on an fd we own.
        unsafe { libc::fcntl(remote_end.as_raw_fd(), libc::F_SETFD, 0) };
        let opts_bits = sys::PTRACE_O_EXITKILL
            | sys::PTRACE_O_TRACECLONE
            | sys::PTRACE_O_TRACEFORK
            | sys::PTRACE_O_SUSPEND_SECCOMP;
        let (init, t) =
            stasis_kernel::child::spawn_in_new_pidns(root.pid, opts_bits).map_err(spawn_err)?;
        (t, Some(init))
    } else {
        (spawn_stopped(Some(root.pid)).map_err(spawn_err)?, None)
    };
    drop(remote_end);
    let root_outer = t.pid();
    let mut procs = match Proc::adopt(t, 0, root.pid) {
        Ok(p) => vec![p],
        Err(e) => {
            let left = stasis_kernel::child::kill_and_reap_all(
                &[root_outer, init.unwrap_or(0)],
                REAP_WAIT,
            );
            if !left.is_empty() {
                tracing::warn!("tasks {left:?} of the abandoned restore were not reaped");
            }
            return Err(e);
        }
    };

    // Verify pack checksums in parallel with the rebuild.
    let to_verify: Vec<_> = chain
        .iter()
        .flat_map(|c| {
            c.manifest
                .processes
                .iter()
                .filter_map(move |p| p.pack.as_ref().map(|r| (c.pack_path(r), r.clone())))
        })
        .filter(|(path, _)| {
            packs
                .iter()
                .flatten()
                .any(|s| path.as_ref().is_ok_and(|p| p.as_path() == s.pack.path()))
        })
        .collect();
    // A lazy restore checks only what it fills now; the filler checks each
    // run it reads.
    let eager: Option<Vec<(u64, u64)>> = opts.lazy.as_ref().map(|_| {
        let r: Vec<(u64, u64)> = m
            .processes
            .iter()
            .flat_map(|p| p.vmas.iter())
            .filter(|v| !lazy_area(v))
            .map(|v| (v.start, v.end))
            .collect();
        stasis_image::chain::normalize(r)
    });
    let verifier = std::thread::spawn(move || -> Result<(), ImageError> {
        for (path, pref) in to_verify {
            let pack = PackReader::open(&path?, Some(&pref))?;
            match &eager {
                None => pack.verify()?,
                Some(ranges) => {
                    let mut buf = Vec::new();
                    for e in stasis_image::chain::runs_touching(pack.runs(), ranges) {
                        buf.resize(usize::try_from(e.len()).unwrap_or(0), 0);
                        pack.read_run(&e, &mut buf)?;
                    }
                }
            }
        }
        Ok(())
    });

    let watchdog = Watchdog::start();
    let mut lazy_bytes = 0u64;
    let built = build_tree(
        &mut procs,
        &cp,
        &plan,
        &packs,
        &transport,
        h,
        opts,
        &mut lazy_bytes,
    );
    let verified = match verifier.join() {
        Ok(r) => r.map_err(RestoreError::Corrupt),
        Err(_) => Err(RestoreError::Layout(
            "the checksum verifier panicked".into(),
        )),
    };
    // A damaged pack is the error to report even if the build also failed
    // (damaged data can make it fail first, with a vaguer message).
    let result = verified.and(built).and_then(|bytes| {
        // Every process gets its registers back while all stay stopped
        // (children first); only then are they let go, all in one
        // short loop, the root last. A restorer killed before that
        // loop takes the whole stopped tree with it (PTRACE_O_EXITKILL):
        // never a child running without its parent.
        let mut ready = Vec::new();
        for (i, (p, img)) in procs.iter_mut().zip(&m.processes).enumerate().rev() {
            if p.live {
                jump(p, img)?;
                ready.push(i);
            }
        }
        for i in ready {
            release(&mut procs[i])?;
        }
        Ok(bytes)
    });
    drop(watchdog);
    match result {
        Ok(bytes) => Ok(Restored {
            checkpoint: cp.number,
            pid: procs[0].t.pid(),
            pid_in_namespace: init.map(|_| root.pid),
            init_pid: init,
            processes: m.processes.len(),
            threads: m.processes.iter().map(|p| p.threads.len()).sum(),
            pages: bytes / sys::PAGE_SIZE,
            bytes,
            lazy_bytes,
            total_us: micros(t0),
            pid_wait_us,
        }),
        Err(e) => {
            kill_tree(procs, init);
            Err(e)
        }
    }
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

/// Everything up to (not including) the final jumps. Returns bytes filled.
#[allow(clippy::too_many_arguments)]
fn build_tree(
    procs: &mut Vec<Proc>,
    cp: &Checkpoint,
    plan: &tree::Plan,
    packs: &[Vec<PageSource>],
    transport: &OwnedFd,
    h: u64,
    opts: &RestoreOptions,
    lazy_bytes: &mut u64,
) -> Result<u64> {
    let m = &cp.manifest;
    let root = &mut procs[0];

    root.t
        .set_options(
            sys::PTRACE_O_EXITKILL
                | sys::PTRACE_O_TRACECLONE
                | sys::PTRACE_O_TRACEFORK
                | sys::PTRACE_O_SUSPEND_SECCOMP,
        )
        .map_err(step("tracing process and thread creation"))?;
    root.t
        .set_sigmask(!0)
        .map_err(step("blocking signals in the stub"))?;

    // CPU features: the image may only use what this CPU has.
    let cpu_x = stasis_kernel::probe::xfeatures_of(&root.t.xstate()?);
    let img_x = m.host.xfeatures;
    if img_x & !cpu_x != 0 {
        return Err(RestoreError::Incompatible(format!(
            "the image uses CPU state components {:#x} that this CPU lacks (it has {cpu_x:#x})",
            img_x & !cpu_x
        )));
    }

    // Control area, free in the stub's layout and in every process's.
    let mut busy: Vec<(u64, u64)> = read_maps(root.t.pid())?
        .iter()
        .map(|m| (m.0, m.1))
        .collect();
    busy.extend(
        m.processes
            .iter()
            .flat_map(|p| p.vmas.iter().map(|v| (v.start, v.end))),
    );
    let ctl = build::find_gap(&busy, CTL_SIZE)
        .ok_or_else(|| RestoreError::Layout("no free address range for the control page".into()))?;
    let rwx = (libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC) as u64;
    let fl = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE) as u64;
    let got = root
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
    root.mem
        .write(ctl, &[0x0f, 0x05, 0xcc])
        .map_err(step("writing the syscall instruction"))?;
    root.t.set_syscall_insn(ctl);
    root.ctl = ctl;

    // The stub inherited stasis's rseq registration; its area is about to
    // be unmapped, and the kernel would fault writing to it.
    if let Some(c) = root.t.rseq_config()? {
        root.sys(
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
    // Clean slate: no mappings but the control area, no fds but the transport.
    root.sys("munmap", libc::SYS_munmap, &[0, ctl])
        .map_err(step("unmapping the stub below the control page"))?;
    root.sys(
        "munmap",
        libc::SYS_munmap,
        &[ctl + CTL_SIZE, TASK_TOP - ctl - CTL_SIZE],
    )
    .map_err(step("unmapping the stub above the control page"))?;
    root.sys("close_range", sys::SYS_CLOSE_RANGE, &[0, h - 1, 0])
        .map_err(step("closing the stub's fds"))?;
    root.sys(
        "close_range",
        sys::SYS_CLOSE_RANGE,
        &[h + 1, u64::from(u32::MAX), 0],
    )
    .map_err(step("closing the stub's fds"))?;
    if plan.setsid[0] {
        root.sys("setsid", libc::SYS_setsid, &[])
            .map_err(step("becoming a session leader"))?;
    }

    // The tree, top-down: each process forked by its parent.
    for (i, img) in m.processes.iter().enumerate().skip(1) {
        let parent = plan.parent[i].ok_or_else(|| {
            RestoreError::Inconsistent(format!("process {} has no parent", img.pid))
        })?;
        let parent_proc = &mut procs[parent];
        parent_proc.cur = None;
        build::fork_process(parent_proc, img.pid)?;
        let outer = parent_proc.t.take_new_task().unwrap_or(img.pid);
        let t = Tracee::adopt_new_thread(outer)
            .map_err(step(format!("taking over new process {}", img.pid)))?;
        let mut p = Proc::adopt(t, ctl, img.pid)?;
        if plan.setsid[i] {
            p.sys("setsid", libc::SYS_setsid, &[])
                .map_err(step(format!("making process {} a session leader", img.pid)))?;
        }
        procs.push(p);
    }
    // Process groups: leaders first, then members.
    for pass in 0..2 {
        for (i, p) in procs.iter_mut().enumerate() {
            match (pass, plan.group[i]) {
                (0, tree::Group::Own) => {
                    p.sys("setpgid", libc::SYS_setpgid, &[0, 0])
                        .map_err(step(format!("making process {} a group leader", p.pid)))?;
                }
                (1, tree::Group::Join(g)) => {
                    p.sys("setpgid", libc::SYS_setpgid, &[0, sarg(i64::from(g))])
                        .map_err(step(format!("moving process {} into group {g}", p.pid)))?;
                }
                _ => {}
            }
        }
    }

    // Zombies: exit with the saved status (their parents reap them later).
    for (i, img) in m.processes.iter().enumerate() {
        if let Some(status) = img.zombie {
            make_zombie(&mut procs[i], status)?;
            let parent = plan.parent[i].unwrap_or(0);
            drop_sigchld(&mut procs[parent], &m.processes[parent])?;
        }
    }

    // System V segments exist before anyone attaches them.
    sysv::prepare(&m.sysv_shm)?;

    // Every live process, in manifest order (shared memory is first mapped
    // by the earliest process that has it).
    let total: u64 = packs.iter().flatten().map(PageSource::bytes).sum();
    let mut filled = 0u64;
    let mut factory = files::FdFactory::new(
        &m.pipes,
        &m.ghosts,
        m.processes.iter().flat_map(|p| p.fds.iter()),
    );
    let mut shm_first: HashMap<u64, (i32, u64, u64, u64)> = HashMap::new();
    for (i, img) in m.processes.iter().enumerate() {
        if img.zombie.is_some() {
            continue;
        }
        let p = &mut procs[i];
        filled += build_process(
            p,
            m.processes[0].pid,
            img,
            &packs[i],
            &mut factory,
            &mut shm_first,
            transport,
            h,
            (filled, total, opts),
            lazy_bytes,
        )?;
        if let Some(cb) = &opts.progress {
            cb(filled, total);
        }
    }
    if filled != total {
        return Err(RestoreError::Inconsistent(format!(
            "{} pack bytes lie outside every saved area",
            total - filled
        )));
    }
    factory.finish_tcp()?;
    sysv::finish(&m.sysv_shm);
    Ok(filled)
}

/// Makes a stub exit with the wait status `status` (a zombie until its
/// parent reaps it).
fn make_zombie(p: &mut Proc, status: i32) -> Result<()> {
    p.live = false;
    let (nr, args, what): (i64, Vec<u64>, &str) = if libc::WIFSIGNALED(status) {
        let sig = libc::WTERMSIG(status);
        // Die of the signal, without a core dump.
        let a = p
            .put(build::SCRATCH_STRUCT, &build::words(&[0, 0]))
            .map_err(step("rlimit"))?;
        p.sys(
            "prlimit64",
            libc::SYS_prlimit64,
            &[0, libc::RLIMIT_CORE.into(), a, 0],
        )
        .map_err(step("disabling core dumps of a zombie"))?;
        let act = p
            .put(build::SCRATCH_STRUCT, &build::words(&[0, 0, 0, 0]))
            .map_err(step("sigaction"))?;
        p.sys(
            "rt_sigaction",
            libc::SYS_rt_sigaction,
            &[sarg(i64::from(sig)), act, 0, 8],
        )
        .map_err(step("resetting a signal"))?;
        p.t.set_sigmask(0)
            .map_err(step("unblocking signals of a zombie"))?;
        (
            libc::SYS_kill,
            vec![sarg(i64::from(p.pid)), sarg(i64::from(sig))],
            "killing a zombie-to-be",
        )
    } else {
        (
            libc::SYS_exit_group,
            vec![sarg(i64::from(libc::WEXITSTATUS(status)))],
            "exiting a zombie-to-be",
        )
    };
    match p.t.syscall_raw(&p.base, nr, &args) {
        Err(KernelError::Died { .. }) => {
            p.t.forget();
            Ok(())
        }
        Ok(r) => Err(RestoreError::Layout(format!(
            "{what} {}: it did not exit (result {r})",
            p.pid
        ))),
        Err(e) => Err(RestoreError::Step {
            what: format!("{what} {}", p.pid),
            source: e,
        }),
    }
}

/// Consumes the SIGCHLD a rebuilt zombie sent to its parent, unless the
/// parent had one pending in the image.
fn drop_sigchld(parent: &mut Proc, img: &ProcessImage) -> Result<()> {
    let chld = libc::SIGCHLD.unsigned_abs();
    let had = img
        .shared_pending
        .iter()
        .chain(img.threads.iter().flat_map(|t| t.pending.iter()))
        .any(|s| s.signo == chld);
    if had {
        return Ok(());
    }
    parent.cur = None;
    let set = parent
        .put(build::SCRATCH_STRUCT, &(1u64 << (chld - 1)).to_le_bytes())
        .map_err(step("sigset"))?;
    let ts = parent
        .put(build::SCRATCH_STRUCT + 64, &build::words(&[0, 0]))
        .map_err(step("timespec"))?;
    // EAGAIN when nothing is pending is fine.
    let _ = parent
        .t
        .syscall_raw(&parent.base, libc::SYS_rt_sigtimedwait, &[set, 0, ts, 8]);
    Ok(())
}

type Progress<'a> = (u64, u64, &'a RestoreOptions);

/// Rebuilds one live process (not its final jump). Returns bytes filled.
#[allow(clippy::too_many_arguments)]
fn build_process(
    s: &mut Proc,
    root_pid: i32,
    p: &ProcessImage,
    sources: &[PageSource],
    factory: &mut files::FdFactory<'_>,
    shm_first: &mut HashMap<u64, (i32, u64, u64, u64)>,
    transport: &OwnedFd,
    h: u64,
    progress: Progress<'_>,
    lazy_bytes: &mut u64,
) -> Result<u64> {
    let pid = s.pid;
    s.cur = None;
    restore_vdso(s, p)?;

    // Memory: every pack holding pages of this process is opened inside
    // it (one for a full checkpoint, several along an incremental chain).
    let mut pack_fds = Vec::with_capacity(sources.len());
    for src in sources {
        let path = src.pack.path().to_string_lossy().into_owned();
        let a = s
            .put_cstr(build::SCRATCH_PATH, &path)
            .map_err(step("pack path"))?;
        let fd = s
            .sys(
                "open",
                libc::SYS_open,
                &[a, (libc::O_RDONLY | libc::O_CLOEXEC) as u64, 0],
            )
            .map_err(|source| RestoreError::File {
                path,
                what: "page pack".into(),
                source,
            })?;
        pack_fds.push(fd);
    }
    let (base_done, total, opts) = progress;
    let mut filled = 0u64;
    let mut last = Instant::now();
    let mut lazy_areas = Vec::new();
    for v in &p.vmas {
        if let Some((ino, off)) = v.shm {
            if let Some(&(first_pid, fstart, fend, foff)) = shm_first.get(&ino) {
                map_shared_again(s, v, (first_pid, fstart, fend, foff), off, transport, h)?;
                continue;
            }
            shm_first.insert(ino, (s.t.pid(), v.start, v.end, off));
        }
        let runs: Vec<Vec<RunEntry>> = sources
            .iter()
            .map(|src| build::clip_runs(&src.runs, v.start, v.end))
            .collect();
        let fills: Vec<build::Fill<'_>> = runs
            .iter()
            .zip(&pack_fds)
            .map(|(r, fd)| (r.as_slice(), *fd))
            .collect();
        let data: u64 = runs.iter().flatten().map(RunEntry::len).sum();
        if opts.lazy.is_some() && data > 0 && lazy_area(v) {
            // Mapped with its final protection and left empty: the filler
            // maps each page in (UFFDIO_COPY needs no write permission).
            build::map_vma(s, v, &[], None)?;
            lazy_areas.push((v.start, v.end));
            filled += data;
            *lazy_bytes += data;
            continue;
        }
        if let VmaKind::Ghost { id, name, .. } = &v.kind {
            // Hand the rebuilt file over just above the transport, map, close.
            let writable = v.shared && v.prot & libc::PROT_WRITE.unsigned_abs() != 0;
            let file = factory.ghost_for_mapping(*id, name, writable)?;
            let tmp = i32::try_from(h + 1)
                .map_err(|_| RestoreError::Layout("fd number overflow".into()))?;
            files::plant(s, transport, h, file.as_fd(), tmp, true)?;
            let r = build::map_vma(s, v, &fills, Some(h + 1));
            s.sys("close", libc::SYS_close, &[h + 1])
                .map_err(step("closing a mapped file"))?;
            filled += r?;
        } else {
            filled += build::map_vma(s, v, &fills, None)?;
        }
        if let Some(cb) = &opts.progress {
            if last.elapsed() >= Duration::from_millis(100) {
                cb(base_done + filled, total);
                last = Instant::now();
            }
        }
    }
    for fd in pack_fds {
        s.sys("close", libc::SYS_close, &[fd])
            .map_err(step("closing a pack"))?;
    }
    if let Some(sink) = &opts.lazy {
        if !lazy_areas.is_empty() {
            arm_lazy(s, p.pid, &lazy_areas, sink.as_ref())?;
        }
    }

    // mm fields, with the exe file. The kernel refuses to switch the exe
    // link away from a file that is still mapped, so when the stub already
    // runs the same file (a stasis binary restoring a stasis workload) the
    // link is left as it is.
    let same_exe = {
        use std::os::unix::fs::MetadataExt;
        let cur = std::fs::metadata(format!("/proc/{}/exe", s.t.pid())).ok();
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

    // File descriptors, then what refers to them by number (epoll).
    factory.set_cwd(&p.cwd);
    for fd in &p.fds {
        let desc = factory.get(fd)?;
        files::plant(s, transport, h, desc.as_fd(), fd.fd, fd.cloexec)?;
    }
    for fd in &p.fds {
        // An epoll description shared by several fds is filled once.
        if factory.claim_epoll(fd) {
            files::restore_epoll(s, fd)?;
        }
        if factory.claim_flock(fd) {
            files::restore_flock(s, fd)?;
        }
        files::restore_posix_locks(s, fd)?;
    }
    s.sys("close", libc::SYS_close, &[h])
        .map_err(step("closing the fd transport"))?;
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
        build::clone_thread(s, th.tid)?;
        let tid = s.t.take_new_task().unwrap_or(th.tid);
        let mut t =
            Tracee::adopt_new_thread(tid).map_err(step(format!("taking over new thread {tid}")))?;
        t.set_syscall_insn(s.ctl);
        let mut base = t
            .regs()
            .map_err(step(format!("registers of new thread {tid}")))?;
        base.rsp = 0;
        s.threads.push((t, base));
    }
    // POSIX timers at their IDs (signals may target threads: after them).
    s.cur = None;
    build::create_posix_timers(s, &p.posix_timers)?;
    if p.child_subreaper {
        s.sys(
            "prctl(PR_SET_CHILD_SUBREAPER)",
            libc::SYS_prctl,
            &[libc::PR_SET_CHILD_SUBREAPER as u64, 1],
        )
        .map_err(step("making the process a child subreaper again"))?;
    }
    // The root's parent is the restorer now, which may exit (--detach): its
    // parent-death signal would kill it for no reason, so only the other
    // processes (whose parents are restored with them) get theirs back.
    if pid == root_pid {
        // The root stub was made to die with the restorer until
        // PTRACE_O_EXITKILL held (see `spawn_stopped`): it outlives it.
        s.sys(
            "prctl(PR_SET_PDEATHSIG)",
            libc::SYS_prctl,
            &[libc::PR_SET_PDEATHSIG as u64, 0],
        )
        .map_err(step("clearing the root's parent-death signal"))?;
    } else if p.pdeath_signal != 0 {
        s.sys(
            "prctl(PR_SET_PDEATHSIG)",
            libc::SYS_prctl,
            &[
                libc::PR_SET_PDEATHSIG as u64,
                sarg(i64::from(p.pdeath_signal)),
            ],
        )
        .map_err(step("restoring the parent-death signal"))?;
    }
    // Per-thread state, credentials (per thread in the kernel) and
    // thread-directed pending signals, each run by the thread itself (a
    // thread may queue kernel-style siginfo only to itself).
    for (i, th) in p.threads.iter().enumerate() {
        s.cur = i.checked_sub(1);
        build::thread_state(s, th)?;
        restore_creds(s, p)?;
        if p.no_new_privs {
            s.sys(
                "prctl(PR_SET_NO_NEW_PRIVS)",
                libc::SYS_prctl,
                &[libc::PR_SET_NO_NEW_PRIVS as u64, 1, 0, 0, 0],
            )
            .map_err(step("restoring no_new_privs"))?;
        }
        for si in &th.pending {
            let a = s
                .put(build::SCRATCH_STRUCT, &si.raw)
                .map_err(step("siginfo"))?;
            s.sys(
                "rt_tgsigqueueinfo",
                libc::SYS_rt_tgsigqueueinfo,
                &[
                    sarg(i64::from(pid)),
                    sarg(i64::from(th.tid)),
                    u64::from(si.signo),
                    a,
                ],
            )
            .map_err(step(format!(
                "queueing pending signal {} of thread {}",
                si.signo, th.tid
            )))?;
        }
    }
    s.cur = None;
    for si in &p.shared_pending {
        let a = s
            .put(build::SCRATCH_STRUCT, &si.raw)
            .map_err(step("siginfo"))?;
        s.sys(
            "rt_sigqueueinfo",
            libc::SYS_rt_sigqueueinfo,
            &[sarg(i64::from(pid)), u64::from(si.signo), a],
        )
        .map_err(step(format!("queueing pending signal {}", si.signo)))?;
    }
    build::restore_itimers(s, &p.itimers)?;
    build::arm_posix_timers(s, &p.posix_timers)?;
    Ok(filled)
}

/// Creates a userfaultfd inside the process, registers `areas` with it in
/// missing mode, and hands it to the lazy filler.
fn arm_lazy(s: &mut Proc, image_pid: i32, areas: &[(u64, u64)], sink: &dyn LazySink) -> Result<()> {
    let flags = (libc::O_CLOEXEC | libc::O_NONBLOCK).unsigned_abs();
    let n = s
        .sys("userfaultfd", sys::SYS_USERFAULTFD, &[u64::from(flags)])
        .map_err(step("creating a userfaultfd for the lazy restore"))?;
    let taken = stasis_kernel::pidfd::pidfd_open(s.t.pid())
        .and_then(|pfd| stasis_kernel::pidfd::pidfd_getfd(&pfd, i32::try_from(n).unwrap_or(-1)));
    s.sys("close", libc::SYS_close, &[n])
        .map_err(step("closing the process's copy of its userfaultfd"))?;
    let fd = taken?;
    let want = sink.features();
    let got = stasis_kernel::uffd::api(&fd, want)?;
    if got & want != want {
        return Err(RestoreError::Incompatible(format!(
            "this kernel's userfaultfd lacks the events a lazy restore needs ({:?}); restore without --lazy",
            stasis_kernel::uffd::feature_names(want & !got)
        )));
    }
    let u = stasis_kernel::uffd::Userfaultfd::from_fd(fd, got);
    for &(a, b) in areas {
        u.register(a, b - a, sys::UFFDIO_REGISTER_MODE_MISSING)?;
    }
    sink.hand(image_pid, s.t.pid(), areas, u.fd()).map_err(|e| {
        RestoreError::Layout(format!(
            "handing process {image_pid} to the lazy filler: {e}"
        ))
    })
}

/// Maps shared anonymous memory that an earlier area (`first`: pid, start,
/// end, offset in the shmem object) already created, through that area's
/// `/proc/PID/map_files` entry, so both share the same pages.
fn map_shared_again(
    s: &mut Proc,
    v: &stasis_image::manifest::Vma,
    first: (i32, u64, u64, u64),
    off: u64,
    transport: &OwnedFd,
    h: u64,
) -> Result<()> {
    let (fpid, fstart, fend, foff) = first;
    let len = v.end - v.start;
    if off < foff || off + len > foff + (fend - fstart) {
        return Err(RestoreError::Unsupported(format!("shared memory at {:#x}-{:#x} of process {} covers pages that process {fpid} does not map", v.start, v.end, s.pid)));
    }
    let path = format!("/proc/{fpid}/map_files/{fstart:x}-{fend:x}");
    let writable = v.prot & libc::PROT_WRITE.unsigned_abs() != 0;
    let file: OwnedFd = std::fs::OpenOptions::new()
        .read(true)
        .write(writable)
        .open(&path)
        .map_err(|e| RestoreError::File {
            path: path.clone(),
            what: "shared memory".into(),
            source: KernelError::Io {
                what: "open".into(),
                source: e,
            },
        })?
        .into();
    // Hand it over at the first number above the transport, map, close.
    let tmp =
        i32::try_from(h + 1).map_err(|_| RestoreError::Layout("fd number overflow".into()))?;
    files::plant(s, transport, h, file.as_fd(), tmp, true)?;
    let flags = (libc::MAP_SHARED | libc::MAP_FIXED) as u64;
    let at = s.sys(
        "mmap",
        libc::SYS_mmap,
        &[v.start, len, u64::from(v.prot), flags, h + 1, off - foff],
    );
    s.sys("close", libc::SYS_close, &[h + 1])
        .map_err(step("closing a shared-memory fd"))?;
    let at = at.map_err(step(format!(
        "sharing memory at {:#x}-{:#x}",
        v.start, v.end
    )))?;
    if at != v.start {
        return Err(RestoreError::Layout(format!(
            "shared area {:#x}-{:#x} landed at {at:#x}",
            v.start, v.end
        )));
    }
    Ok(())
}

fn restore_vdso(s: &mut Proc, p: &ProcessImage) -> Result<()> {
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

fn restore_creds(s: &mut Proc, p: &ProcessImage) -> Result<()> {
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

/// Final step for one process: other threads' state, then the main
/// thread's xstate; unmap the control page; at that syscall-exit stop load
/// the main thread's mask and registers. It stays stopped until
/// [`release`].
fn jump(s: &mut Proc, p: &ProcessImage) -> Result<()> {
    let regs_of = |th: &stasis_image::manifest::ThreadImage| {
        UserRegs::from_words(&th.regs).ok_or_else(|| {
            RestoreError::Inconsistent(format!(
                "thread {} has {} register words",
                th.tid,
                th.regs.len()
            ))
        })
    };
    for ((t, _), th) in s.threads.iter_mut().zip(&p.threads[1..]) {
        let regs = regs_of(th)?;
        t.set_xstate(&th.xstate).map_err(step(format!(
            "restoring FPU/SSE/AVX state of thread {}",
            th.tid
        )))?;
        t.set_sigmask(th.sigmask).map_err(step(format!(
            "restoring the signal mask of thread {}",
            th.tid
        )))?;
        t.set_regs(&regs)
            .map_err(step(format!("loading the registers of thread {}", th.tid)))?;
    }
    let th = &p.threads[0];
    let regs = regs_of(th)?;
    s.t.set_xstate(&th.xstate)
        .map_err(step("restoring FPU/SSE/AVX state"))?;
    // Unmap the control page with every signal still blocked (an armed
    // timer may have fired); its syscall-exit stop is where the process gets
    // its own mask and registers back (the instruction after `syscall` is gone).
    s.cur = None;
    s.sys("munmap", libc::SYS_munmap, &[s.ctl, CTL_SIZE])
        .map_err(step("unmapping the control page"))?;
    s.t.set_sigmask(th.sigmask)
        .map_err(step("restoring the signal mask"))?;
    s.t.set_regs(&regs)
        .map_err(step("loading the saved registers"))?;
    Ok(())
}

/// Lets a process that [`jump`] made ready run: detaches its threads.
fn release(s: &mut Proc) -> Result<()> {
    for (t, _) in &mut s.threads {
        t.detach().map_err(step("detaching a thread"))?;
    }
    s.t.detach().map_err(step("detaching"))?;
    s.live = false;
    Ok(())
}
