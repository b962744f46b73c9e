//! Freeze a process, read its state and memory, and write a Stasis image.
//!
//! # The path of a dump
//! 1. **Pre-flight, untouched**: the process exists, and every fd and
//!    mapping is of a supported kind. Anything unsupported is
//!    refused here, before the process is even stopped.
//! 2. **Freeze** every thread (listing `/proc/PID/task` until no new one
//!    appears): `PTRACE_SEIZE` + `PTRACE_INTERRUPT`; every signal is
//!    blocked through `PTRACE_SETSIGMASK` so remote syscalls cannot be
//!    disturbed (signals arriving meanwhile stay pending and are recorded).
//! 3. **Registers**: general registers (normalised so an interrupted syscall
//!    restarts) and the XSAVE area.
//! 4. **Remote syscalls** (a `syscall` instruction found in the vDSO): a
//!    scratch page is mapped, `rt_sigaction` of every signal, `sigaltstack`,
//!    `getitimer` and `brk(0)` are run inside the process, and the page is
//!    unmapped again.
//! 5. **/proc**: maps, stat, status, limits, auxv, fds and fdinfo.
//! 6. **Memory**: `PAGEMAP_SCAN` finds the pages that hold private data; they
//!    are read with `process_vm_readv` in large batches and streamed into the
//!    page pack.
//! 7. **Commit** the checkpoint atomically; then either kill the process or,
//!    with `leave_running`, put its registers and mask back and detach.
//!
//! Any failure before the commit puts the process back exactly as it was
//! and leaves no checkpoint behind.

pub mod proc;

use std::time::Instant;

use stasis_image::manifest::{
    AltStack, DumpStats, FdImage, FdKind, HostInfo, ITimer, Manifest, ProcessImage, RseqConfig,
    SigAction, SigInfo, ThreadImage, Vma, VmaKind,
};
use stasis_image::{ImageDir, ImageError};
use stasis_kernel::mem::{read_ranges, ProcessMemory};
use stasis_kernel::pagemap::{Pagemap, ScanQuery};
use stasis_kernel::ptrace::normalize_interrupted_syscall;
use stasis_kernel::{KernelError, Tracee, UserRegs};
use stasis_sys as sys;

/// Errors of a dump. Each leaves the target running as it was.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error("process {pid} does not exist: check the PID (`ps -p {pid}`)")]
    NoSuchProcess { pid: i32 },
    #[error("cannot dump process {pid}: {what}")]
    Unsupported { pid: i32, what: String },
    #[error("cannot trace process {pid}: permission denied reading /proc/{pid}/{file} (run stasis as root, or as the process's owner with CAP_SYS_PTRACE)")]
    Permission { pid: i32, file: String },
    #[error("reading /proc/{pid}/{file} failed")]
    Proc {
        pid: i32,
        file: String,
        #[source]
        source: std::io::Error,
    },
    #[error("unexpected content in /proc/{pid}/{file}: {what}")]
    ProcFormat {
        pid: i32,
        file: String,
        what: String,
    },
    #[error(transparent)]
    Kernel(#[from] KernelError),
    #[error("writing the image failed: {0}")]
    Image(#[from] ImageError),
}

impl CaptureError {
    pub(crate) fn from_proc(pid: i32, file: &str, e: std::io::Error) -> Self {
        if e.kind() == std::io::ErrorKind::NotFound
            && std::fs::metadata(format!("/proc/{pid}")).is_err()
        {
            CaptureError::NoSuchProcess { pid }
        } else if e.kind() == std::io::ErrorKind::PermissionDenied {
            CaptureError::Permission { pid, file: file.into() }
        } else {
            CaptureError::Proc {
                pid,
                file: file.into(),
                source: e,
            }
        }
    }
}

type Result<T, E = CaptureError> = std::result::Result<T, E>;

/// What to dump and how.
#[derive(Default)]
pub struct DumpOptions {
    pub pid: i32,
    /// Let the process run on after the dump instead of killing it.
    pub leave_running: bool,
    /// Called with (bytes saved, bytes to save) while memory is written.
    pub progress: Option<Box<dyn Fn(u64, u64) + Send>>,
}

/// What a dump did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DumpReport {
    pub checkpoint: u32,
    pub pid: i32,
    pub pages: u64,
    pub bytes: u64,
    pub frozen_us: u64,
    pub total_us: u64,
    pub killed: bool,
}

/// Dumps one process (all its threads) into `store` as a new checkpoint.
pub fn dump(store: &ImageDir, opts: &DumpOptions) -> Result<DumpReport> {
    let t0 = Instant::now();
    let pid = opts.pid;
    preflight(pid)?;
    let mut frozen = freeze(pid)?;
    let frozen_at = Instant::now();

    let result = capture_frozen(store, opts, &mut frozen, t0, frozen_at);
    match result {
        Ok(mut report) => {
            if opts.leave_running {
                frozen.release()?;
            } else {
                frozen.kill();
                report.killed = true;
            }
            report.frozen_us = micros(frozen_at);
            report.total_us = micros(t0);
            Ok(report)
        }
        Err(e) => {
            // Put the process back as it was; report the original error.
            if let Err(re) = frozen.release() {
                tracing::error!(
                    pid,
                    "could not resume process {pid} after a failed dump: {re}"
                );
            }
            Err(e)
        }
    }
}

fn micros(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_micros()).unwrap_or(u64::MAX)
}

/// One frozen thread and what is needed to let it go unchanged.
struct FrozenThread {
    tracee: Tracee,
    orig_regs: UserRegs,
    orig_mask: u64,
}

/// A frozen process (main thread first) and what is needed to let it go
/// unchanged.
struct Frozen {
    pid: i32,
    threads: Vec<FrozenThread>,
    done: bool,
}

/// Seizes and stops every thread of `pid`, listing `/proc/PID/task` again
/// until no new thread appears (a running thread may create one while we
/// stop the others). Every thread gets all signals blocked.
fn freeze(pid: i32) -> Result<Frozen> {
    let mut f = Frozen { pid, threads: Vec::new(), done: false };
    loop {
        let mut new = 0;
        for tid in list_tasks(pid)? {
            if f.threads.iter().any(|t| t.tracee.pid() == tid) {
                continue;
            }
            let mut tracee = match Tracee::seize(tid, 0) {
                Ok(t) => t,
                // A thread that exited meanwhile is simply not part of the image.
                Err(KernelError::NoSuchProcess { .. }) if tid != pid => continue,
                Err(KernelError::NoSuchProcess { pid }) => return Err(CaptureError::NoSuchProcess { pid }),
                Err(e) => return Err(e.into()),
            };
            tracee.interrupt()?;
            let orig_mask = tracee.block_all_signals()?;
            let orig_regs = tracee.regs()?;
            f.threads.push(FrozenThread { tracee, orig_regs, orig_mask });
            new += 1;
        }
        if new == 0 {
            break;
        }
    }
    // Main thread first.
    f.threads.sort_by_key(|t| (t.tracee.pid() != pid, t.tracee.pid()));
    if f.threads.first().map(|t| t.tracee.pid()) != Some(pid) {
        return Err(CaptureError::Unsupported { pid, what: "its main thread has exited while other threads run".into() });
    }
    Ok(f)
}

impl Frozen {
    /// Restores every thread's registers (with an interrupted syscall set up
    /// to restart) and signal mask, then detaches.
    fn release(&mut self) -> Result<()> {
        if self.done {
            return Ok(());
        }
        self.done = true;
        let mut first_err = None;
        for t in &mut self.threads {
            let mut regs = t.orig_regs;
            normalize_interrupted_syscall(&mut regs, true);
            let r = t.tracee.set_regs(&regs).and_then(|()| t.tracee.set_sigmask(t.orig_mask)).and_then(|()| t.tracee.detach());
            if let Err(e) = r {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), |e| Err(e.into()))
    }

    fn kill(&mut self) {
        self.done = true;
        // SAFETY: sending SIGKILL to the process we just dumped.
        unsafe { libc::kill(self.pid, libc::SIGKILL) };
        for t in &mut self.threads {
            t.tracee.forget();
        }
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        if !self.done {
            let _ = self.release();
        }
    }
}

fn list_tasks(pid: i32) -> Result<Vec<i32>> {
    let rd = std::fs::read_dir(proc::proc_path(pid, "task")).map_err(|e| CaptureError::from_proc(pid, "task", e))?;
    let mut t: Vec<i32> = rd.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect();
    t.sort_unstable();
    Ok(t)
}

/// Classifies an fd link target; `Err` names what is unsupported.
fn classify_fd(pid: i32, fd: i32, link: &str) -> Result<(), String> {
    let kind = if link.starts_with("pipe:") {
        Some("a pipe")
    } else if link.starts_with("socket:") {
        Some("a socket")
    } else if link.starts_with("anon_inode:") {
        Some("an anonymous inode (eventfd, epoll, signalfd, timerfd, userfaultfd, io_uring...)")
    } else if link.starts_with("/dev/pts/")
        || link.starts_with("/dev/tty")
        || link == "/dev/console"
        || link.starts_with("/dev/ptmx")
    {
        Some("a terminal")
    } else if link.ends_with(" (deleted)") {
        Some("a deleted file")
    } else if !link.starts_with('/') {
        Some("a special file")
    } else {
        None
    };
    if let Some(k) = kind {
        let hint = if k == "a terminal" {
            "; redirect the program's stdin/stdout/stderr to files (or /dev/null) to checkpoint it"
        } else {
            ""
        };
        return Err(format!(
            "fd {fd} is {k} ({link}), which this version of stasis cannot checkpoint yet{hint}"
        ));
    }
    let meta = std::fs::metadata(format!("/proc/{pid}/fd/{fd}"))
        .map_err(|e| format!("fd {fd} ({link}): {e}"))?;
    use std::os::unix::fs::FileTypeExt;
    let ft = meta.file_type();
    if ft.is_file() || ft.is_dir() || ft.is_char_device() {
        Ok(())
    } else {
        Err(format!(
            "fd {fd} ({link}) is a {}, which this version of stasis cannot checkpoint yet",
            if ft.is_fifo() {
                "FIFO"
            } else if ft.is_block_device() {
                "block device"
            } else {
                "special file"
            }
        ))
    }
}

fn list_fds(pid: i32) -> Result<Vec<i32>> {
    let rd = std::fs::read_dir(proc::proc_path(pid, "fd"))
        .map_err(|e| CaptureError::from_proc(pid, "fd", e))?;
    let mut fds: Vec<i32> = rd
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    fds.sort_unstable();
    Ok(fds)
}

/// Checks everything that can be checked without stopping the process.
fn preflight(pid: i32) -> Result<()> {
    if pid <= 0 {
        return Err(CaptureError::NoSuchProcess { pid });
    }
    if std::fs::metadata(format!("/proc/{pid}")).is_err() {
        return Err(CaptureError::NoSuchProcess { pid });
    }
    if pid == std::process::id() as i32 {
        return Err(CaptureError::Unsupported {
            pid,
            what: "stasis cannot dump itself".into(),
        });
    }
    let stat =
        proc::parse_stat(&proc::read(pid, "stat")?).map_err(|w| CaptureError::ProcFormat {
            pid,
            file: "stat".into(),
            what: w,
        })?;
    if stat.state == 'Z' || stat.state == 'X' {
        return Err(CaptureError::Unsupported {
            pid,
            what: "it is a zombie (it has exited and waits to be reaped)".into(),
        });
    }
    let maps = proc::read(pid, "maps")?;
    if maps.trim().is_empty() {
        return Err(CaptureError::Unsupported {
            pid,
            what: "it is a kernel thread (it has no memory map)".into(),
        });
    }
    for fd in list_fds(pid)? {
        let link = proc::read_link(pid, &format!("fd/{fd}"))?;
        classify_fd(pid, fd, &link).map_err(|what| CaptureError::Unsupported { pid, what })?;
    }
    for m in proc::parse_maps(&maps).map_err(|w| CaptureError::ProcFormat {
        pid,
        file: "maps".into(),
        what: w,
    })? {
        vma_kind(&m).map_err(|what| CaptureError::Unsupported { pid, what })?;
    }
    Ok(())
}

/// What backs a maps entry, or why it is unsupported. `Ok(None)` means the
/// area is not part of the image (`[vsyscall]`).
fn vma_kind(m: &proc::MapsEntry) -> Result<Option<VmaKind>, String> {
    let n = m.name.as_str();
    Ok(Some(match n {
        "[vsyscall]" => return Ok(None),
        "[vdso]" => VmaKind::Vdso,
        "[vvar]" => VmaKind::Vvar,
        "[vvar_vclock]" => VmaKind::VvarVclock,
        "" | "[heap]" | "[stack]" => VmaKind::Anon,
        _ if n.starts_with("[anon:") || n.starts_with("[anon_shmem:") => VmaKind::Anon,
        _ if m.shared && n.starts_with("/dev/zero (deleted)") => VmaKind::Anon,
        _ if n.starts_with("/SYSV") => {
            return Err(format!(
                "area {:#x}-{:#x} is System V shared memory ({n}), not supported yet",
                m.start, m.end
            ))
        }
        _ if n.ends_with(" (deleted)") => {
            return Err(format!(
                "area {:#x}-{:#x} maps a deleted file ({n}), not supported yet",
                m.start, m.end
            ))
        }
        _ if n.starts_with('/') => VmaKind::File {
            path: n.to_string(),
            offset: m.offset,
            dev: (u64::from(m.dev.0) << 32) | u64::from(m.dev.1),
            ino: m.ino,
        },
        _ if n.starts_with('[') => {
            return Err(format!(
                "area {:#x}-{:#x} is a special mapping {n} that stasis does not know",
                m.start, m.end
            ))
        }
        _ => {
            return Err(format!(
                "area {:#x}-{:#x} has an unexpected name {n:?}",
                m.start, m.end
            ))
        }
    }))
}

/// Finds a `syscall` instruction (0f 05) in the vDSO of the process.
fn find_syscall_insn(mem: &ProcessMemory, maps: &[proc::MapsEntry]) -> Option<u64> {
    let vdso = maps.iter().find(|m| m.name == "[vdso]")?;
    let len = usize::try_from(vdso.end - vdso.start).ok()?;
    let mut buf = vec![0u8; len];
    mem.read(vdso.start, &mut buf).ok()?;
    buf.windows(2)
        .position(|w| w == [0x0f, 0x05])
        .map(|p| vdso.start + p as u64)
}

struct RemoteState {
    sigactions: Vec<SigAction>,
    itimers: Vec<ITimer>,
    brk: u64,
    /// Per thread, in `Frozen::threads` order: altstack and clear_child_tid.
    threads: Vec<(AltStack, u64)>,
}

const PR_GET_TID_ADDRESS: u64 = 40;

/// Runs the remote syscalls that read state only the process can report:
/// process-wide ones in the main thread, per-thread ones in each thread.
fn remote_state(f: &mut Frozen, mem: &ProcessMemory) -> Result<RemoteState> {
    let rw = (libc::PROT_READ | libc::PROT_WRITE) as u64;
    let flags = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64;
    let main_base = f.threads[0].orig_regs;
    let scratch = f.threads[0].tracee.syscall(&main_base, "mmap", libc::SYS_mmap, &[0, 4096, rw, flags, u64::MAX, 0])?;
    let res = (|| -> Result<RemoteState> {
        let main = &mut f.threads[0];
        let (t, base) = (&mut main.tracee, &main.orig_regs);
        let mut sigactions = Vec::new();
        for sig in 1..=64u32 {
            if sig == libc::SIGKILL.unsigned_abs() || sig == libc::SIGSTOP.unsigned_abs() {
                continue;
            }
            t.syscall(base, "rt_sigaction", libc::SYS_rt_sigaction, &[u64::from(sig), 0, scratch, 8])?;
            let w = mem.read_u64s(scratch, 4)?;
            sigactions.push(SigAction { signo: sig, handler: w[0], flags: w[1], restorer: w[2], mask: w[3] });
        }
        let mut itimers = Vec::new();
        for which in 0..3u32 {
            t.syscall(base, "getitimer", libc::SYS_getitimer, &[u64::from(which), scratch])?;
            let w = mem.read_u64s(scratch, 4)?;
            itimers.push(ITimer { which, interval_us: w[0] * 1_000_000 + w[1], value_us: w[2] * 1_000_000 + w[3] });
        }
        let brk = t.syscall(base, "brk", libc::SYS_brk, &[0])?;
        let mut threads = Vec::new();
        for th in &mut f.threads {
            let (t, base) = (&mut th.tracee, &th.orig_regs);
            t.syscall(base, "sigaltstack", libc::SYS_sigaltstack, &[0, scratch])?;
            let w = mem.read_u64s(scratch, 3)?;
            let altstack = AltStack { sp: w[0], flags: i32::try_from(w[1] & 0x7fff_ffff).unwrap_or(0), size: w[2] };
            t.syscall(base, "prctl(PR_GET_TID_ADDRESS)", libc::SYS_prctl, &[PR_GET_TID_ADDRESS, scratch])?;
            let tid_address = mem.read_u64s(scratch, 1)?[0];
            threads.push((altstack, tid_address));
        }
        Ok(RemoteState { sigactions, itimers, brk, threads })
    })();
    let unmap = f.threads[0].tracee.syscall(&main_base, "munmap", libc::SYS_munmap, &[scratch, 4096]);
    let st = res?;
    unmap?;
    Ok(st)
}

/// `get_robust_list` of another thread (head, length).
fn robust_list(tid: i32) -> Result<(u64, u64)> {
    let mut head = 0u64;
    let mut len = 0usize;
    // SAFETY: get_robust_list writes a pointer and a size to the two valid
    // out-pointers we pass.
    let r = unsafe { libc::syscall(libc::SYS_get_robust_list, tid, &mut head as *mut u64, &mut len as *mut usize) };
    if r < 0 {
        return Err(KernelError::Io { what: format!("get_robust_list({tid})"), source: std::io::Error::last_os_error() }.into());
    }
    Ok((head, len as u64))
}

fn capture_frozen(
    store: &ImageDir,
    opts: &DumpOptions,
    f: &mut Frozen,
    t0: Instant,
    frozen_at: Instant,
) -> Result<DumpReport> {
    let pid = opts.pid;
    let mem = ProcessMemory::open(pid)?;
    let maps_text = proc::read(pid, "maps")?;
    let maps = proc::parse_maps(&maps_text).map_err(|w| CaptureError::ProcFormat { pid, file: "maps".into(), what: w })?;
    let insn = find_syscall_insn(&mem, &maps).ok_or(KernelError::NoSyscallInsn { pid })?;
    for t in &mut f.threads {
        t.tracee.set_syscall_insn(insn);
    }
    let remote = remote_state(f, &mem)?;
    let shared_pending = f.threads[0].tracee.pending_siginfo(true)?;
    let mut threads = Vec::new();
    let mut xfeatures = 0;
    for (t, (altstack, clear_child_tid)) in f.threads.iter().zip(&remote.threads) {
        let tid = t.tracee.pid();
        let mut regs = t.orig_regs;
        normalize_interrupted_syscall(&mut regs, false);
        let xstate = t.tracee.xstate()?;
        xfeatures = stasis_kernel::probe::xfeatures_of(&xstate);
        let (robust_list, robust_list_len) = robust_list(tid)?;
        threads.push(ThreadImage {
            tid,
            regs: regs.to_words().to_vec(),
            xstate,
            sigmask: t.orig_mask,
            pending: t.tracee.pending_siginfo(false)?.iter().map(siginfo).collect(),
            altstack: altstack.clone(),
            comm: proc::read(pid, &format!("task/{tid}/comm"))?.trim_end_matches('\n').to_string(),
            rseq: t.tracee.rseq_config()?.map(|c| RseqConfig { ptr: c.rseq_abi_pointer, size: c.rseq_abi_size, signature: c.signature }),
            clear_child_tid: *clear_child_tid,
            robust_list,
            robust_list_len,
        });
    }

    // /proc state.
    let stat =
        proc::parse_stat(&proc::read(pid, "stat")?).map_err(|w| CaptureError::ProcFormat {
            pid,
            file: "stat".into(),
            what: w,
        })?;
    let (umask, creds) =
        proc::parse_status(&proc::read(pid, "status")?).map_err(|w| CaptureError::ProcFormat {
            pid,
            file: "status".into(),
            what: w,
        })?;
    let rlimits =
        proc::parse_limits(&proc::read(pid, "limits")?).map_err(|w| CaptureError::ProcFormat {
            pid,
            file: "limits".into(),
            what: w,
        })?;
    let personality =
        u32::from_str_radix(proc::read(pid, "personality")?.trim(), 16).map_err(|_| {
            CaptureError::ProcFormat {
                pid,
                file: "personality".into(),
                what: "not a hex number".into(),
            }
        })?;
    let auxv_bytes = proc::read_bytes(pid, "auxv")?;
    let mut mm = stat.mm.clone();
    mm.brk = remote.brk;
    mm.auxv = auxv_bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
        .collect();
    let growsdown = proc::parse_smaps_growsdown(&proc::read(pid, "smaps")?);
    let comm = proc::read(pid, "comm")?.trim_end_matches('\n').to_string();

    let mut fds = Vec::new();
    for fd in list_fds(pid)? {
        let link = proc::read_link(pid, &format!("fd/{fd}"))?;
        classify_fd(pid, fd, &link).map_err(|what| CaptureError::Unsupported { pid, what })?;
        let (pos, flags) =
            proc::parse_fdinfo(&proc::read(pid, &format!("fdinfo/{fd}"))?).map_err(|w| {
                CaptureError::ProcFormat {
                    pid,
                    file: format!("fdinfo/{fd}"),
                    what: w,
                }
            })?;
        let meta = std::fs::metadata(proc::proc_path(pid, &format!("fd/{fd}")))
            .map_err(|e| CaptureError::from_proc(pid, &format!("fd/{fd}"), e))?;
        use std::os::unix::fs::MetadataExt;
        let cloexec = flags & libc::O_CLOEXEC as u32 != 0;
        fds.push(FdImage {
            fd,
            flags: flags & !(libc::O_CLOEXEC as u32),
            cloexec,
            kind: FdKind::Path {
                path: link,
                pos,
                mode: meta.mode(),
                size: meta.size(),
            },
        });
    }

    // Memory areas and the pages to save.
    let mut vmas = Vec::new();
    let mut ranges: Vec<(u64, usize)> = Vec::new();
    let pagemap = Pagemap::open(pid)?;
    let mut have_scan = true;
    for m in &maps {
        let Some(kind) = vma_kind(m).map_err(|what| CaptureError::Unsupported { pid, what })?
        else {
            continue;
        };
        let data: Vec<(u64, u64)> = match (&kind, m.shared) {
            (VmaKind::Vdso | VmaKind::Vvar | VmaKind::VvarVclock, _) => Vec::new(),
            (VmaKind::File { .. }, true) => Vec::new(),
            (VmaKind::Anon, true) => vec![(m.start, m.end)],
            _ => {
                let regions = if have_scan {
                    match pagemap.scan(m.start, m.end, ScanQuery::private_data()) {
                        Ok(r) => r,
                        Err(KernelError::Unsupported { .. }) => {
                            have_scan = false;
                            pagemap.private_data_by_entries(m.start, m.end)?
                        }
                        Err(e) => return Err(e.into()),
                    }
                } else {
                    pagemap.private_data_by_entries(m.start, m.end)?
                };
                regions.iter().map(|r| (r.start, r.end)).collect()
            }
        };
        for (a, b) in data {
            ranges.push((a, usize::try_from(b - a).unwrap_or(0)));
        }
        vmas.push(Vma {
            start: m.start,
            end: m.end,
            prot: m.prot(),
            shared: m.shared,
            growsdown: growsdown.contains(&m.start),
            name: if m.name.starts_with('[') {
                m.name.clone()
            } else {
                String::new()
            },
            kind,
        });
    }

    // Pages, streamed through a bounded two-stage pipeline.
    let mut ck = store.begin_checkpoint()?;
    let mut pack = ck.create_pack(pid)?;
    copy_pages(&mem, ranges, &mut pack, opts.progress.as_deref())?;
    let pages = pack.pages();
    let bytes = pack.bytes();
    let pack_ref = pack.finish()?;

    let process = ProcessImage {
        pid,
        ppid: stat.ppid,
        pgid: stat.pgrp,
        sid: stat.session,
        comm,
        exe: proc::read_link(pid, "exe")?,
        cwd: proc::read_link(pid, "cwd")?,
        umask,
        personality,
        creds,
        rlimits,
        mm,
        vmas,
        fds,
        sigactions: remote.sigactions,
        shared_pending: shared_pending.iter().map(siginfo).collect(),
        itimers: remote.itimers,
        threads,
        pack: Some(pack_ref),
    };
    let manifest = Manifest {
        checkpoint: ck.number(),
        parent: None,
        tool_version: env!("CARGO_PKG_VERSION").to_string(),
        created_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        host: HostInfo {
            hostname: std::fs::read_to_string("/proc/sys/kernel/hostname")
                .unwrap_or_default()
                .trim()
                .to_string(),
            kernel_release: stasis_kernel::probe::kernel_release(),
            xfeatures,
            page_size: sys::PAGE_SIZE,
        },
        root_pid: pid,
        processes: vec![process],
        stats: DumpStats {
            frozen_us: micros(frozen_at),
            total_us: micros(t0),
            pages_written: pages,
        },
    };
    let checkpoint = ck.commit(&manifest)?;
    Ok(DumpReport {
        checkpoint,
        pid,
        pages,
        bytes,
        frozen_us: 0,
        total_us: 0,
        killed: false,
    })
}

/// Size of each pipeline buffer, and how many are in flight: the dumper's
/// memory use is bounded by their product, whatever the image size.
const PIPE_BUF: usize = 8 << 20;
const PIPE_DEPTH: usize = 3;

/// Copies `ranges` of the process into the pack: a reader thread fills
/// buffers with `process_vm_readv` while this thread hashes and writes the
/// previous one, so reading and writing overlap.
fn copy_pages(
    mem: &ProcessMemory,
    mut ranges: Vec<(u64, usize)>,
    pack: &mut stasis_image::PackWriter,
    progress: Option<&(dyn Fn(u64, u64) + Send)>,
) -> Result<()> {
    use std::sync::mpsc;
    let total: u64 = ranges.iter().map(|r| r.1 as u64).sum();
    let (full_tx, full_rx) = mpsc::sync_channel::<Result<(Vec<u8>, Vec<(u64, usize)>)>>(PIPE_DEPTH);
    let (empty_tx, empty_rx) = mpsc::sync_channel::<Vec<u8>>(PIPE_DEPTH);
    for _ in 0..PIPE_DEPTH {
        let _ = empty_tx.send(vec![0u8; PIPE_BUF]);
    }
    std::thread::scope(|scope| -> Result<()> {
        scope.spawn(move || {
            let mut i = 0;
            while i < ranges.len() {
                let Ok(mut buf) = empty_rx.recv() else { return };
                // Take ranges until the buffer is full, splitting a large one.
                let mut batch: Vec<(u64, usize)> = Vec::new();
                let mut used = 0usize;
                while i < ranges.len() && used < PIPE_BUF {
                    let (a, l) = ranges[i];
                    let take = l.min(PIPE_BUF - used);
                    batch.push((a, take));
                    used += take;
                    if take == l {
                        i += 1;
                    } else {
                        ranges[i] = (a + take as u64, l - take);
                    }
                }
                let r = read_ranges(mem, &batch, &mut buf[..used])
                    .map(|()| (buf, batch))
                    .map_err(CaptureError::from);
                let failed = r.is_err();
                if full_tx.send(r).is_err() || failed {
                    return;
                }
            }
        });
        let mut done = 0u64;
        let mut last = Instant::now();
        for item in full_rx {
            let (buf, batch) = item?;
            let mut off = 0usize;
            for (a, l) in batch {
                pack.write_run(a, &buf[off..off + l])?;
                off += l;
            }
            done += off as u64;
            let _ = empty_tx.send(buf);
            if let Some(p) = progress {
                if last.elapsed().as_millis() >= 100 {
                    p(done, total);
                    last = Instant::now();
                }
            }
        }
        if let Some(p) = progress {
            p(done, total);
        }
        Ok(())
    })
}

fn siginfo(raw: &[u8; sys::SIGINFO_SIZE]) -> SigInfo {
    let signo = u32::from_le_bytes(raw[0..4].try_into().unwrap_or([0; 4]));
    SigInfo {
        signo,
        raw: raw.to_vec(),
    }
}
