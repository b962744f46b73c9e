//! Output helpers: logging, progress bars, human units, `inspect`.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use stasis_image::manifest::{FdKind, VmaKind};

/// Logs go to stderr; `STASIS_LOG` (tracing filter syntax) overrides `-v`.
pub fn init_tracing(verbose: u8) {
    let default = match verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("STASIS_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
}

/// A progress bar that appears only for operations longer than a second,
/// and only on a terminal.
pub struct Progress {
    inner: Arc<Mutex<(Option<ProgressBar>, Instant)>>,
    label: &'static str,
}

impl Progress {
    pub fn new(label: &'static str) -> Self {
        Self {
            inner: Arc::new(Mutex::new((None, Instant::now()))),
            label,
        }
    }

    /// A callback for the library: (done, total) in bytes.
    pub fn callback(&self) -> Box<dyn Fn(u64, u64) + Send> {
        let inner = Arc::clone(&self.inner);
        let label = self.label;
        Box::new(move |done, total| {
            let Ok(mut g) = inner.lock() else { return };
            if g.0.is_none() && g.1.elapsed() >= Duration::from_secs(1) && total > 0 {
                let pb = ProgressBar::new(total);
                if let Ok(style) = ProgressStyle::with_template(
                    "{msg} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
                ) {
                    pb.set_style(style.progress_chars("=> "));
                }
                pb.set_message(label);
                g.0 = Some(pb);
            }
            if let Some(pb) = &g.0 {
                pb.set_length(total);
                pb.set_position(done);
            }
        })
    }

    pub fn finish(&self) {
        if let Ok(mut g) = self.inner.lock() {
            if let Some(pb) = g.0.take() {
                pb.finish_and_clear();
            }
        }
    }
}

/// One line describing a dump.
pub fn dump_line(r: &stasis_capture::DumpReport) -> String {
    let kind = match (r.parent, &r.track) {
        (Some(p), Some(t)) => format!("incremental on {p}, {t}"),
        (Some(p), None) => format!("incremental on {p}"),
        _ => "full".to_string(),
    };
    format!(
        "checkpoint {} ({kind}) of pid {} ({} process(es), {} thread(s)): {} pages, {} in {} (frozen {}), {}{}",
        r.checkpoint,
        r.pid,
        r.processes,
        r.threads,
        r.pages,
        bytes(r.bytes),
        secs(r.total_us),
        secs(r.frozen_us),
        if r.killed {
            "process killed"
        } else {
            "process left running"
        },
        match &r.armed {
            Some(b) => format!(", tracking armed ({b})"),
            None => String::new(),
        }
    ) + &match &r.concurrent {
        Some(c) if c.method == "uffd" => format!(
            "\n  concurrent (uffd write-protection): prepare stop {}; {} pages copied after the release; {} write faults, latency p50 {:.0} us, p99 {:.0} us; side buffer peak {}; writers waited {}x ({})",
            secs(c.prepare_stop_us),
            c.pages_after_release,
            c.write_faults,
            c.fault_p50_us.unwrap_or(0.0),
            c.fault_p99_us.unwrap_or(0.0),
            bytes(c.cow_peak_bytes),
            c.writer_waits,
            secs(c.writer_wait_us)
        ),
        Some(c) => format!(
            "\n  concurrent (fork snapshot): {} pages copied after the release; {} write faults during the copy; copy-on-write peak {}; paused {}x; reap stop {}{}",
            c.pages_after_release,
            c.write_faults,
            bytes(c.cow_peak_bytes),
            c.paused,
            secs(c.reap_stop_us),
            match &c.fallback {
                Some(why) => format!("\n  (write-protection abandoned: {why})"),
                None => String::new(),
            }
        ),
        None => String::new(),
    }
}

/// "12.3 MiB".
pub fn bytes(b: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", units[u])
    }
}

/// "0.123 s".
pub fn secs(us: u64) -> String {
    format!("{:.3} s", us as f64 / 1e6)
}

/// Writes a pidfile atomically (temporary name, then rename).
pub fn write_pidfile(path: &Path, pid: i32) -> std::io::Result<()> {
    stasis_image::write_atomic_file(path, format!("{pid}\n").as_bytes())
        .map_err(std::io::Error::other)
}

/// Waits for our child `pid`; returns its exit code (128+signal if killed).
/// SIGINT/SIGTERM/SIGHUP sent to stasis meanwhile are forwarded to it.
pub fn wait_child(pid: i32, forward_to: i32) -> Result<u8> {
    use nix::sys::wait::{waitpid, WaitStatus};
    forward_signals_to(forward_to);
    loop {
        match waitpid(nix::unistd::Pid::from_raw(pid), None) {
            Ok(WaitStatus::Exited(_, c)) => return Ok(u8::try_from(c).unwrap_or(1)),
            Ok(WaitStatus::Signaled(_, sig, _)) => {
                return Ok(u8::try_from(128 + sig as i32).unwrap_or(255))
            }
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => {
                return Err(std::io::Error::from(e))
                    .with_context(|| format!("waiting for restored process {pid}"))
            }
        }
    }
}

/// SIGINT, SIGTERM and SIGHUP sent to stasis go to `pid` from now on.
pub fn forward_signals_to(pid: i32) {
    stasis_kernel::launch::forward_signals_to(pid);
}

/// `stasis inspect`.
pub fn inspect(dir: &Path, checkpoint: Option<u32>, json: bool) -> Result<ExitCode> {
    let store = stasis_image::ImageDir::open(dir)
        .with_context(|| format!("opening image directory {}", dir.display()))?;
    let numbers = match checkpoint {
        Some(n) => vec![n],
        None => store.checkpoints()?,
    };
    let latest = store.latest()?;
    let mut out = Vec::new();
    let mut bad = 0;
    for n in numbers {
        let cp = store.load(Some(n))?;
        let verified = stasis_image::verify_checkpoint(&cp);
        let summary = stasis_image::summarize(&cp);
        if verified.is_err() {
            bad += 1;
        }
        use stasis_image::touch::{read_touch_set, TouchSource};
        let touch: Vec<(TouchSource, _)> = [TouchSource::Window, TouchSource::Faults]
            .into_iter()
            .map(|s| (s, read_touch_set(cp.dir(), s)))
            .collect();
        if json {
            let mut v = serde_json::to_value(&summary)?;
            for (src, t) in &touch {
                let key = match src {
                    TouchSource::Window => "touch_window",
                    TouchSource::Faults => "touch_faults",
                };
                v[key] = match t {
                    Ok(Some(ts)) => serde_json::json!({
                        "pages": ts.pages(),
                        "window_ms": ts.window_ms,
                        "processes": ts.procs.len(),
                    }),
                    Ok(None) => serde_json::Value::Null,
                    Err(e) => serde_json::json!({ "error": e.to_string() }),
                };
            }
            v["verified"] = serde_json::Value::Bool(verified.is_ok());
            if let Err(e) = &verified {
                v["error"] = serde_json::Value::String(e.to_string());
            }
            if checkpoint.is_some() {
                v["manifest"] = serde_json::to_value(detail_json(&cp))?;
            }
            out.push(v);
            continue;
        }
        let mark = if Some(n) == latest { " (latest)" } else { "" };
        println!(
            "checkpoint {n}{mark}: {}, {} process(es), {} ({}), taken with stasis {} on {} ({}), checksums {}",
            chain_kind(&summary),
            summary.processes.len(),
            stored_pages(summary.incremental, summary.total_pages, summary.memory_pages),
            bytes(summary.total_bytes),
            summary.tool_version,
            summary.hostname,
            summary.kernel_release,
            match &verified {
                Ok(()) => "ok".to_string(),
                Err(e) => format!("BAD: {e}"),
            }
        );
        for p in &summary.processes {
            println!(
                "  pid {} ({}) {}: {} thread(s), {} mappings, {} fds, {}",
                p.pid,
                p.comm,
                p.exe,
                p.threads,
                p.vmas,
                p.fds,
                stored_pages(summary.incremental, p.pack_pages, p.memory_pages)
            );
        }
        if summary.content_bytes > 0 {
            println!(
                "  saved file content: {} ({})",
                bytes(summary.content_bytes),
                stasis_image::CONTENT_PACK_NAME
            );
        }
        for (src, t) in &touch {
            match (src, t) {
                (TouchSource::Window, Ok(Some(ts))) => println!(
                    "  touch set: {} pages written in the {} window after the checkpoint (sent first by a lazy restore)",
                    ts.pages(),
                    secs(ts.window_ms * 1000)
                ),
                (TouchSource::Faults, Ok(Some(ts))) => println!(
                    "  fault order: {} pages, as they faulted in the last lazy restore (sent first next time)",
                    ts.pages()
                ),
                (_, Ok(None)) => {}
                (_, Err(e)) => println!("  {e}"),
            }
        }
        if checkpoint.is_some() {
            print_detail(&cp);
        }
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else if out.is_empty() && bad == 0 && store.checkpoints()?.is_empty() {
        println!("no checkpoints in {}", dir.display());
    }
    let _ = std::io::stdout().flush();
    Ok(if bad == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(2)
    })
}

/// "full", "full (note: ...)" or "incremental (parent 2, uffd)".
fn chain_kind(s: &stasis_image::CheckpointSummary) -> String {
    let mut what = Vec::new();
    if let Some(p) = s.parent {
        what.push(format!("parent {p}"));
        if !s.track.is_empty() {
            what.push(s.track.clone());
        }
    }
    if !s.note.is_empty() {
        what.push(format!("note: {}", s.note));
    }
    let kind = if s.incremental { "incremental" } else { "full" };
    if what.is_empty() {
        kind.to_string()
    } else {
        format!("{kind} ({})", what.join(", "))
    }
}

/// "412 pages stored of 65536" for an incremental checkpoint, else
/// "65536 pages".
fn stored_pages(incremental: bool, stored: u64, memory: u64) -> String {
    if incremental {
        format!("{stored} pages stored of {memory}")
    } else {
        format!("{stored} pages")
    }
}

fn detail_json(cp: &stasis_image::Checkpoint) -> &stasis_image::manifest::Manifest {
    &cp.manifest
}

fn print_detail(cp: &stasis_image::Checkpoint) {
    for p in &cp.manifest.processes {
        println!(
            "  process {}: cwd {}, umask {:03o}, uid {:?}",
            p.pid, p.cwd, p.umask, p.creds.uid
        );
        println!("  mappings:");
        let pack = p.pack.as_ref().and_then(|r| cp.open_pack(r).ok());
        for v in &p.vmas {
            println!("{}", vma_line(v, pack.as_ref()));
        }
        println!("  fds:");
        for f in &p.fds {
            let what = fd_description(&f.kind);
            let shared = f
                .shared_id
                .map(|i| format!(" shared#{i}"))
                .unwrap_or_default();
            println!(
                "    {:>4} {what} flags {:#o}{}{shared}",
                f.fd,
                f.flags,
                if f.cloexec { " cloexec" } else { "" }
            );
        }
        if p.zombie.is_some() {
            println!("  zombie, wait status {:#x}", p.zombie.unwrap_or(0));
        }
        let handled: Vec<String> = p
            .sigactions
            .iter()
            .filter(|a| a.handler != 0)
            .map(|a| format!("{}{}", a.signo, if a.handler == 1 { ":ign" } else { "" }))
            .collect();
        println!(
            "  signals with a disposition: {}",
            if handled.is_empty() {
                "none".into()
            } else {
                handled.join(" ")
            }
        );
        for t in &p.threads {
            println!(
                "  thread {}: mask {:#x}, {} pending, xstate {} bytes",
                t.tid,
                t.sigmask,
                t.pending.len(),
                t.xstate.len()
            );
        }
    }
}

/// One line of `stasis inspect -c N` for a memory area.
fn vma_line(v: &stasis_image::manifest::Vma, pack: Option<&stasis_image::PackReader>) -> String {
    let pages: u64 = pack
        .as_ref()
        .map(|pk| {
            pk.runs_in(v.start, v.end)
                .iter()
                .map(|r| u64::from(r.npages))
                .sum()
        })
        .unwrap_or(0);
    let prot = format!(
        "{}{}{}{}",
        if v.prot & 1 != 0 { 'r' } else { '-' },
        if v.prot & 2 != 0 { 'w' } else { '-' },
        if v.prot & 4 != 0 { 'x' } else { '-' },
        if v.shared { 's' } else { 'p' }
    );
    let what = match &v.kind {
        VmaKind::Anon => {
            if v.name.is_empty() {
                "anon".to_string()
            } else {
                v.name.clone()
            }
        }
        VmaKind::File { path, offset, .. } => format!("{path} @{offset:#x}"),
        VmaKind::SysvShm {
            shmid,
            partial: false,
            ..
        } => format!("System V segment {shmid}"),
        VmaKind::SysvShm { shmid, offset, .. } => {
            format!("System V segment {shmid} from byte {offset}")
        }
        VmaKind::Ghost { name, offset, .. } => {
            format!("{name} (deleted, content saved) @{offset:#x}")
        }
        VmaKind::Vdso => "[vdso]".into(),
        VmaKind::Vvar => "[vvar]".into(),
        VmaKind::Aio => "[aio] (an AIO context's ring)".into(),
        VmaKind::SocketRing { fd, .. } => format!("the rings of the packet socket of fd {fd}"),
        VmaKind::BpfMap { fd, offset } => {
            format!("the BPF array of fd {fd} (mapped from {offset:#x})")
        }
        VmaKind::VvarVclock => "[vvar_vclock]".into(),
        VmaKind::IoUring { offset, .. } => {
            format!("anon_inode:[io_uring] @{offset:#x} (a ring, saved with its fd)")
        }
    };
    format!(
        "    {:012x}-{:012x} {prot} {:>8} pages saved  {what}",
        v.start, v.end, pages
    )
}

/// What an fd of `stasis inspect -c N` is.
fn fd_description(kind: &FdKind) -> String {
    match kind {
        FdKind::Path { path, pos, .. } => format!("{path} pos {pos}"),
        FdKind::Pipe { id, write_end } => format!(
            "pipe:[{id}] {} end",
            if *write_end { "write" } else { "read" }
        ),
        FdKind::Fifo { path, .. } => format!("FIFO {path}"),
        FdKind::Eventfd { count, semaphore } => format!(
            "eventfd count {count}{}",
            if *semaphore { " semaphore" } else { "" }
        ),
        FdKind::Timerfd {
            clockid,
            value_ns,
            interval_ns,
            ..
        } => format!("timerfd clock {clockid} next {value_ns} ns every {interval_ns} ns"),
        FdKind::Signalfd { mask } => format!("signalfd mask {mask:#x}"),
        FdKind::Packet(p) => format!(
            "packet socket type {} protocol {:#06x}{}",
            p.sock_type,
            u16::from_be(u16::try_from(p.protocol & 0xffff).unwrap_or(0)),
            if p.bound.is_empty() { "" } else { " bound" }
        ),
        FdKind::BpfMap(m) => format!(
            "BPF map {:?} type {} ({} elements of {}+{} bytes, at most {}){}{}{}{}",
            m.name,
            m.map_type,
            m.elements.len(),
            m.key_size,
            m.value_size,
            m.max_entries,
            if m.frozen { " frozen" } else { "" },
            if m.cpus > 0 {
                format!(", a value per CPU ({})", m.cpus)
            } else {
                String::new()
            },
            if m.btf.is_some() { ", with BTF" } else { "" },
            if m.inner.is_empty() {
                String::new()
            } else {
                format!(", holding {} maps", m.inner.len())
            }
        ),
        FdKind::Epoll { targets, .. } => format!("epoll with {} fds", targets.len()),
                FdKind::IoUring(u) => format!(
            "io_uring {} SQ / {} CQ entries, {} unreaped completions, {} unsubmitted entries, {} registered files, {} registered buffers",
            u.sq_entries,
            u.cq_entries,
            u.cq_tail.wrapping_sub(u.cq_head),
            u.sq_tail.wrapping_sub(u.sq_head),
            u.files.iter().flatten().count(),
            u.buffers.iter().flatten().count()
        ),
        FdKind::Ghost { path, pos, .. } => {
            format!("{path} (deleted, content saved) pos {pos}")
        }
        FdKind::Memfd { name, pos, .. } => {
            format!("memfd:{name} (content saved) pos {pos}")
        }
        FdKind::Inotify { watches } => format!("inotify with {} watches", watches.len()),
        FdKind::Fanotify { marks, .. } => format!("fanotify group with {} marks", marks.len()),
        FdKind::Pidfd { dead: Some(_), .. } => "pidfd on a process that has exited".to_string(),
        FdKind::Pidfd { pid, .. } => format!("pidfd on process {pid}"),
        FdKind::NsFile { kind, ino, of } => match of {
            stasis_image::manifest::NsFileOf::Own => format!("namespace file {kind}:[{ino}]"),
            stasis_image::manifest::NsFileOf::Dumper => {
                format!("namespace file {kind}:[{ino}] (the dumper's)")
            }
            stasis_image::manifest::NsFileOf::Path(p) => {
                format!("namespace file {kind}:[{ino}] (bound at {p})")
            }
        },
        FdKind::TtyLine {
            path,
            winsize,
            session,
            ..
        } => format!(
            "{path} ({}x{}){}",
            winsize[1],
            winsize[0],
            session.as_ref().map_or(String::new(), |s| format!(
                ", controlling terminal of session {} (foreground group {})",
                s.sid, s.foreground
            ))
        ),
        FdKind::LineDevTty {
            path,
            winsize,
            session,
            ..
        } => format!(
            "/dev/tty ({path} at dump, {}x{}, controlling terminal of session {}, foreground group {})",
            winsize[1], winsize[0], session.sid, session.foreground
        ),
        FdKind::Mqueue { name, queue: None } => format!("POSIX message queue /{name}"),
        FdKind::Mqueue {
            name,
            queue: Some(h),
        } => format!(
            "POSIX message queue /{name}{} (saved, {} messages)",
            if h.deleted { " (deleted)" } else { "" },
            h.queue.messages.len()
        ),
        FdKind::DeletedNode(n) => format!("{} (deleted, mode {:o}) pos {}", n.path, n.mode, n.pos),
        FdKind::Unix(u) => format!(
            "unix socket {:?} {}",
            u.state,
            u.name
                .as_ref()
                .map(|n| String::from_utf8_lossy(n).replace('\0', "@"))
                .unwrap_or_default()
        ),
        FdKind::Netlink(n) => format!(
            "netlink socket protocol {} port id {}",
            n.protocol, n.portid
        ),
        FdKind::PtyMaster(p) => format!(
            "pty master (pts {} at dump), {} bytes queued to the slave, {} to the master",
            p.index,
            p.input_lines.iter().map(Vec::len).sum::<usize>() + p.input.len(),
            p.output.len()
        ),
        FdKind::PtySlave { index } => format!("pty slave (pts {index} at dump)"),
        FdKind::PtyHungUp { index } => {
            format!("pty slave hung up, its master closed (pts {index} at dump)")
        }
        FdKind::CurrentTty { index } => format!("/dev/tty (pts {index} at dump)"),
        FdKind::ExternalTty { current: false } => "the shell job's terminal".into(),
        FdKind::Userfaultfd(u) => format!(
            "userfaultfd: {} area(s) registered, {} page range(s) write-protected",
            u.ranges.len(),
            u.protected.len()
        ),
        FdKind::ExternalTty { current: true } => "/dev/tty (the shell job's terminal)".into(),
        FdKind::Tun(t) => format!(
            "/dev/net/tun attached to {} (flags {:#x}{})",
            t.iff,
            t.flags,
            if t.persist { ", persistent" } else { "" }
        ),
        FdKind::Inet(n) => format!(
            "inet socket port {} {:?}",
            u16::from_be_bytes([
                n.local.get(2).copied().unwrap_or(0),
                n.local.get(3).copied().unwrap_or(0)
            ]),
            match &n.state {
                stasis_image::manifest::InetState::Established(r) => format!(
                    "established, {} bytes to send, {} to read",
                    r.send_queue.len(),
                    r.recv_queue.len()
                ),
                other => format!("{other:?}"),
            }
        ),
    }
}
