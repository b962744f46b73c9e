//! `stasis run`: launch a job and checkpoint it periodically, the first
//! checkpoint full and the next ones incremental, until it exits; restore
//! the latest checkpoint if it crashes (`--restart-on-failure`).

//!
//! The loop and its decisions are `stasis_supervise`; this file is the
//! command line and the [`Host`] it runs on: the job, `stasis-capture`,
//! `stasis-restore`, `stasis-track`'s touch windows, the request channel
//! (`stasis_supervise::request`: the job's `stasis_request_checkpoint()`),
//! and the printing.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use stasis_supervise::request::{Channel, Requester};
use stasis_supervise::{
    describe, Answer, Checkpointed, Dumped, Event, Every, Host, HostError, Leave, ParseError, Wake,
};

pub use stasis_supervise::{parse_duration, parse_size};

use crate::store::{Stored, Target};
use crate::ui;

/// Options of `stasis run`.
#[derive(clap::Args)]
pub struct RunOptions {
    /// Image directory (created if missing), or s3://BUCKET/PREFIX: each
    /// checkpoint is committed in the object store (as by `dump -D`), and
    /// a restart restores the store's latest.
    #[arg(short = 'D', long = "images-dir")]
    pub dir: PathBuf,
    /// Seconds between checkpoints (90, 90s, 15m...), or `auto` for Young's
    /// formula sqrt(2 x checkpoint cost x MTBF) (needs --mtbf).
    #[arg(long, value_name = "SECS|auto")]
    pub every: String,
    /// Mean time between failures, for --every auto (e.g. 6h, 30m).
    #[arg(long, value_parser = parse_duration)]
    pub mtbf: Option<Duration>,
    /// Dirty-tracking backend: auto, uffd, soft-dirty or hash.
    #[arg(long, default_value = "auto", value_name = "BACKEND")]
    pub track: String,
    /// If the job fails (non-zero exit or killed by a signal), restore the
    /// latest checkpoint and carry on.
    #[arg(long)]
    pub restart_on_failure: bool,
    /// Give up after this many restarts.
    #[arg(long, default_value_t = 3)]
    pub max_restarts: u32,
    /// File for the job's stdout and stderr (default DIR/job.log; with an
    /// s3:// store, job.log in its staging directory).
    #[arg(long)]
    pub log: Option<PathBuf>,
    /// Copy memory while the job runs (from copy-on-write fork snapshots,
    /// dirty pages tracked with --track): it stops only while its state
    /// is read.
    #[arg(long)]
    pub concurrent: bool,
    /// With --concurrent: `uffd` keeps the write-protection of each
    /// concurrent copy as the dirty tracking (each checkpoint protects
    /// again and copies only the pages written since the last: a lone
    /// write's page, or the 64 KiB grain of writes next to each other;
    /// each such first write goes through a handler, which costs random
    /// writers more than --track uffd); `auto` or `fork`:
    /// fork snapshots with --track.
    #[arg(long, default_value = "auto", value_parser = parse_cow_method, requires = "concurrent")]
    pub cow_method: stasis_capture::CowMethod,
    /// With --concurrent: stop the job once the pages it has copied on
    /// write during a copy exceed this (0: never).
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    pub cow_buffer: u64,
    /// After each checkpoint, record for SECS (or `auto`: the time the
    /// image takes to retrieve, FREM's rule; off when longer than the
    /// interval) the pages the job writes, as the touch set a lazy restore
    /// sends first. Needs uffd tracking.
    #[arg(long, value_name = "SECS|auto")]
    pub touch_window: Option<String>,
    /// With --restart-on-failure: restart lazily (`restore --lazy`): the
    /// job runs again before its memory has arrived, touch set first.
    #[arg(long, requires = "restart_on_failure")]
    pub lazy_restart: bool,
    /// Also save the POSIX shared memory objects (files in /dev/shm)
    /// whose names match GLOB with each checkpoint (as `dump --shm-file`).
    /// Repeatable.
    #[arg(long = "shm-file", value_name = "GLOB")]
    pub shm_files: Vec<String>,
    /// One JSON object per event instead of text lines.
    #[arg(long)]
    pub json: bool,
    /// The command to run.
    #[arg(last = true, required = true)]
    pub cmd: Vec<String>,
}

/// Parses `auto`, `uffd` or `fork`.
pub fn parse_cow_method(s: &str) -> Result<stasis_capture::CowMethod, ParseError> {
    use stasis_capture::CowMethod;
    match s {
        "auto" => Ok(CowMethod::Auto),
        "uffd" => Ok(CowMethod::Uffd),
        "fork" => Ok(CowMethod::Fork),
        _ => Err(ParseError::CowMethod(s.to_string())),
    }
}

/// Waits until `deadline`, until the job exits or until it asks for a
/// checkpoint on `channel`, whichever is first. `stasis run` is a child
/// subreaper: processes the job leaves behind (its orphans, a snapshot
/// whose process died mid-dump) are reaped here too.
fn wait_until(
    pid: i32,
    deadline: Instant,
    mut channel: Option<&mut Channel>,
) -> Result<Wake<Requester>> {
    loop {
        loop {
            let flags = WaitPidFlag::WNOHANG | WaitPidFlag::__WALL;
            match waitpid(Pid::from_raw(-1), Some(flags)) {
                Ok(WaitStatus::StillAlive) => break,
                Ok(s @ (WaitStatus::Exited(p, _) | WaitStatus::Signaled(p, _, _)))
                    if p.as_raw() == pid =>
                {
                    return Ok(Wake::Exited(s));
                }
                Ok(_) => {} // an orphan reaped
                Err(nix::errno::Errno::EINTR) => {}
                Err(nix::errno::Errno::ECHILD) => {
                    bail!("job {pid} is no longer a child of stasis")
                }
                Err(e) => bail!("waiting for job {pid}: {e}"),
            }
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(Wake::Due);
        }
        let slice = (deadline - now).min(Duration::from_millis(10));
        match channel.as_deref_mut() {
            Some(c) => {
                let asked = c.wait(slice).context("reading the request channel")?;
                if !asked.is_empty() {
                    return Ok(Wake::Requested(asked));
                }
            }
            None => std::thread::sleep(slice),
        }
    }
}

/// A raw wait status as nix's `WaitStatus`.
fn wait_status(pid: i32, status: i32) -> WaitStatus {
    WaitStatus::from_raw(Pid::from_raw(pid), status)
        .unwrap_or(WaitStatus::Exited(Pid::from_raw(pid), 1))
}

fn start_job(cmd: &[String], log: &Path, channel: &Path) -> Result<i32> {
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("opening the job log {}", log.display()))?;
    let err = out.try_clone().context("duplicating the job log")?;
    let mut c = std::process::Command::new(&cmd[0]);
    c.args(&cmd[1..])
        .env(stasis_supervise::request::ENV, channel)
        .stdin(std::process::Stdio::null())
        .stdout(out)
        .stderr(err);
    std::os::unix::process::CommandExt::process_group(&mut c, 0);
    // Descriptors stasis inherited from its caller must not leak into the
    // job (an image may not hold a pipe shared with a process outside it).
    stasis_kernel::launch::close_inherited_fds_on_exec(&mut c);
    let child = c.spawn().with_context(|| format!("starting {}", cmd[0]))?;
    i32::try_from(child.id()).context("pid out of range")
}

/// Reaps whatever the job left to us (without waiting).
fn reap_orphans() {
    while let Ok(s) = waitpid(
        Pid::from_raw(-1),
        Some(WaitPidFlag::WNOHANG | WaitPidFlag::__WALL),
    ) {
        if s == WaitStatus::StillAlive {
            break;
        }
    }
}

/// A checkpoint of the job, as the supervisor sees it (numbered as in the
/// object store, with what was stored there, when it is one).
struct Dump(stasis_capture::DumpReport, Option<Stored>);

impl Dumped for Dump {
    fn checkpoint(&self) -> u32 {
        self.0.checkpoint
    }
    fn total_us(&self) -> u64 {
        self.0.total_us
    }
}

/// `stasis run -D s3://...`: the store, and what the capture's staging
/// directory knew of the latest checkpoint before it was tidied.
struct S3Run {
    target: Arc<Target>,
    seal: stasis_store::seal::SealOptions,
    latest: Option<Taken>,
}

/// A checkpoint stored: its number in the store, what a restore of it
/// brings back, its processes.
struct Taken {
    n: u32,
    restored_bytes: u64,
    pids: Vec<i32>,
}

/// `stasis run`'s host: the job, its checkpoints and restores, printing.
struct Cli<'o> {
    o: &'o RunOptions,
    /// The image directory the capture writes into: `-D`, or the staging
    /// directory of the object store.
    dir: PathBuf,
    store: stasis_image::ImageDir,
    s3: Option<S3Run>,
    backend: stasis_track::Backend,
    log: PathBuf,
    tracker: Box<dyn stasis_track::DirtyTracker + Send>,
    /// --concurrent --cow-method uffd: the write-protection of each
    /// concurrent copy is kept and is the tracking (only the written grains
    /// are protected again and copied at each checkpoint).
    protect_tracks: bool,
    protection: stasis_capture::cow::CowTracking,
    /// Where the job asks for checkpoints.
    channel: Channel,
}

impl Cli<'_> {
    fn say(&self, line: String, v: serde_json::Value) {
        if self.o.json {
            println!("{v}");
        } else {
            println!("{line}");
        }
        let _ = std::io::stdout().flush();
    }

    fn new_tracker(&self) -> Box<dyn stasis_track::DirtyTracker + Send> {
        stasis_track::tracker(self.backend, &stasis_track::state::track_dir(&self.dir))
    }

    fn say_checkpoint(
        &self,
        r: &stasis_capture::DumpReport,
        stored: Option<&Stored>,
        interval: Duration,
        young: Option<stasis_supervise::Young>,
    ) -> Result<()> {
        let kind = if r.parent.is_some() {
            "incremental"
        } else {
            "full"
        };
        let mut line = format!(
            "checkpoint {}: {kind}, {} pages, {}, frozen {:.1} ms, total {:.1} ms",
            r.checkpoint,
            r.pages,
            ui::bytes(r.bytes),
            r.frozen_us as f64 / 1e3,
            r.total_us as f64 / 1e3
        );
        if let Some(n) = &r.note {
            line.push_str(&format!(" (note: {n})"));
        }
        if let (Some(st), Some(s3)) = (stored, &self.s3) {
            let u = &st.uploaded;
            line.push_str(&format!(
                "; committed in {}: {} in {} new chunk(s), {} already stored",
                s3.target.url(),
                ui::bytes(u.stored_bytes),
                u.objects,
                u.reused
            ));
            for l in &st.lines {
                line.push_str(&format!("; {l}"));
            }
        }
        if let Some(y) = young {
            line.push_str(&format!(
                "; next in {:.2} s (Young: sqrt(2 x {:.1} ms x {:.0} s))",
                interval.as_secs_f64(),
                y.cost_secs * 1e3,
                y.mtbf.as_secs_f64()
            ));
        }
        let mut v = serde_json::to_value(r)?;
        v["event"] = "checkpoint".into();
        v["kind"] = kind.into();
        v["interval_s"] = interval.as_secs_f64().into();
        if let (Some(st), Some(s3)) = (stored, &self.s3) {
            let mut u = serde_json::to_value(&st.uploaded)?;
            u["url"] = s3.target.url().into();
            u["replicas"] = st.lines.clone().into();
            v["stored"] = u;
        }
        self.say(line, v);
        Ok(())
    }

    fn say_exited(&self, pid: i32, s: &WaitStatus, code: u8, why: Leave) {
        let (line, v) = match why {
            Leave::Done => (
                format!("job {pid} {}", describe(s)),
                serde_json::json!({"event": "exited", "pid": pid, "code": code}),
            ),
            Leave::NoCheckpoint => (
                format!("job {pid} {}; no checkpoint to restart from", describe(s)),
                serde_json::json!({"event": "exited", "pid": pid, "code": code, "restart": false}),
            ),
            Leave::MaxRestarts(n) => (
                format!(
                    "job {pid} {}; not restarting: {n} restart(s) already (--max-restarts)",
                    describe(s),
                ),
                serde_json::json!({"event": "exited", "pid": pid, "code": code, "restart": false}),
            ),
        };
        self.say(line, v);
    }

    fn say_restored(
        &self,
        failed: i32,
        s: &WaitStatus,
        code: u8,
        cp: u32,
        r: &stasis_restore::Restored,
        restart: u32,
    ) {
        self.say(
            format!(
                "job {failed} {}; restored checkpoint {cp} as pid {} in {}{} (restart {restart} of {})",
                describe(s),
                r.pid,
                ui::secs(r.total_us),
                if r.lazy_bytes > 0 {
                    format!(", {} of memory arriving behind it", ui::bytes(r.lazy_bytes))
                } else {
                    String::new()
                },
                self.o.max_restarts
            ),
            serde_json::json!({"event": "restored", "failed_pid": failed, "code": code,
                "checkpoint": cp, "pid": r.pid, "restart": restart,
                "lazy_bytes": r.lazy_bytes, "total_us": r.total_us}),
        );
    }

    fn restore_now(&mut self, cp: u32) -> Result<stasis_restore::Restored> {
        let _ = stasis_track::state::clear(&self.dir);
        if let Some(s3) = &self.s3 {
            return restore_from_store(s3, cp, self.o.lazy_restart);
        }
        let filler = if self.o.lazy_restart {
            Some(crate::restore_cmd::start_filler(
                self.store.path(),
                cp,
                None,
                (4, 0),
                None,
                None,
            )?)
        } else {
            None
        };
        restore_with_filler(&self.store, cp, filler.as_ref())
    }

    /// A dump through the object store's upload hook succeeded: notes what
    /// the staging checkpoint says before it is tidied, and numbers the
    /// report as the store does.
    fn stored(
        &mut self,
        target: &Target,
        hook: &crate::store::Upload,
        mut r: stasis_capture::DumpReport,
    ) -> Result<Dump> {
        let local = r.checkpoint;
        let cp = self.store.load(Some(local));
        let taken = cp.map(|cp| {
            (
                stasis_image::summarize(&cp).memory_pages * stasis_image::PAGE_SIZE,
                stasis_track::touch::live_pids(&cp.manifest),
            )
        });
        let parent = r.parent.and_then(|p| target.remote_number(p));
        let ((), stored) = target.finish(hook, Ok(()))?;
        r.checkpoint = stored.uploaded.checkpoint;
        r.parent = parent;
        target.tidy();
        if let Some(s3) = self.s3.as_mut() {
            s3.latest = match taken {
                Ok((restored_bytes, pids)) => Some(Taken {
                    n: r.checkpoint,
                    restored_bytes,
                    pids,
                }),
                Err(e) => {
                    eprintln!(
                        "stasis: warning: reading staging checkpoint {local} of checkpoint {}: {e}",
                        r.checkpoint
                    );
                    None
                }
            };
        }
        Ok(Dump(r, Some(stored)))
    }
}

impl S3Run {
    /// What the staging directory said of checkpoint `n` of the store.
    fn taken(&self, n: u32) -> Result<&Taken> {
        self.latest.as_ref().filter(|t| t.n == n).with_context(|| {
            format!(
                "checkpoint {n} of {} is no longer the latest",
                self.target.url()
            )
        })
    }
}

/// Restores checkpoint `cp` of the object store (from a private copy of
/// its chain, sparse when `lazy`: the filler reads the rest there).
fn restore_from_store(s3: &S3Run, cp: u32, lazy: bool) -> Result<stasis_restore::Restored> {
    let (tmp, url) = s3.target.fetch(cp, lazy)?;
    let dir = tmp.image();
    let store = stasis_image::ImageDir::open(&dir).with_context(|| {
        format!(
            "opening the copy of {} at {}",
            s3.target.url(),
            dir.display()
        )
    })?;
    let filler = match &url {
        Some(url) => Some(crate::restore_cmd::start_store_filler(
            &dir,
            cp,
            (url, &s3.target.urls()),
            &s3.seal,
        )?),
        None => None,
    };
    let restored = restore_with_filler(&store, cp, filler.as_ref());
    // (The filler has read what it needs of the copy.)
    drop(tmp);
    restored
}

/// Restores checkpoint `cp` of `store`, lazily through `filler` if given,
/// which is told the job runs (or aborted) once the restore is done.
fn restore_with_filler(
    store: &stasis_image::ImageDir,
    cp: u32,
    filler: Option<&stasis_lazy::Filler>,
) -> Result<stasis_restore::Restored> {
    let restored = stasis_restore::restore(
        store,
        &stasis_restore::RestoreOptions {
            checkpoint: Some(cp),
            lazy: filler.map(crate::restore_cmd::sink),
            cut: None,
            ..Default::default()
        },
    );
    if let Some(f) = filler {
        match &restored {
            Ok(_) => f.done().context("telling the page filler the job runs")?,
            Err(_) => f.abort(),
        }
    }
    Ok(restored?)
}

impl Host for Cli<'_> {
    type Dump = Dump;
    type Touch = stasis_image::touch::TouchSet;
    type Restored = stasis_restore::Restored;
    type Request = Requester;

    fn start(&mut self) -> Result<i32, HostError> {
        // Orphans of the job come to us (and are reaped by `wait_until`).
        nix::sys::prctl::set_child_subreaper(true).context("becoming a child subreaper")?;
        let pid = start_job(&self.o.cmd, &self.log, self.channel.path())?;
        // Ctrl-C, SIGTERM and SIGHUP go to the job (which then exits).
        ui::forward_signals_to(pid);
        Ok(pid)
    }

    fn wait(&mut self, pid: i32, deadline: Instant) -> Result<Wake<Requester>, HostError> {
        Ok(wait_until(pid, deadline, Some(&mut self.channel))?)
    }

    fn answer(&mut self, to: &Requester, answer: &Answer) {
        if let Err(e) = self.channel.answer(to, answer) {
            eprintln!("stasis: warning: answering the job's checkpoint request: {e}");
        }
    }

    fn checkpoint(&mut self, pid: i32) -> Checkpointed<Self::Dump> {
        let mut opts = stasis_capture::DumpOptions {
            pid,
            leave_running: true,
            progress: None,
            concurrent: self.o.concurrent,
            cow_cap: self.o.cow_buffer,
            cow_method: stasis_capture::CowMethod::Auto,
            cut: None,
            tcp_close: false,
            skip_in_flight: false,
            shm_files: self.o.shm_files.clone(),
            shell_job: false,
        };
        // Into an object store: through its staging directory, each
        // checkpoint committed there before it is committed locally.
        let hook = match self.s3.as_ref().map(|s3| Arc::clone(&s3.target)) {
            Some(target) => match target.prepare() {
                Ok(emptied) => {
                    if emptied {
                        // The next dump is full: so is the next copy.
                        self.protection = Default::default();
                    }
                    let hook = target.hook();
                    opts.cut = Some(hook.clone());
                    Some((target, hook))
                }
                Err(e) => return Checkpointed::Failed(e.into()),
            },
            None => None,
        };
        let dumped = if self.protect_tracks {
            stasis_capture::dump_concurrent_tracked(&self.store, &opts, &mut self.protection)
        } else {
            stasis_capture::dump_tracked(&self.store, &opts, Some(&mut *self.tracker))
        };
        let e = match (dumped, hook) {
            (Ok(r), None) => return Checkpointed::Done(Dump(r, None)),
            (Ok(r), Some((target, hook))) => {
                return match self.stored(&target, &hook, r) {
                    Ok(d) => Checkpointed::Done(d),
                    Err(e) => Checkpointed::Failed(e.into()),
                }
            }
            (Err(e), Some((target, hook))) => {
                if hook.committed() {
                    target.tidy();
                }
                match hook.failure() {
                    // The upload failed: that is why.
                    Some(why) => {
                        let e = anyhow::Error::new(e).context(format!(
                            "storing the checkpoint in {} failed: {why}",
                            target.url()
                        ));
                        return Checkpointed::Failed(e.into());
                    }
                    None => e,
                }
            }
            (Err(e), None) => e,
        };
        // The job may have just exited: the next wait says so, unless the
        // dump (as its tracer, and we are its parent) already collected its
        // exit status.
        let exited = match &e {
            stasis_capture::CaptureError::Kernel(stasis_kernel::KernelError::Died {
                pid: p,
                status,
                ..
            }) if *p == pid => Some(wait_status(pid, *status)),
            _ => match wait_until(pid, Instant::now(), None) {
                Ok(Wake::Exited(s)) => Some(s),
                _ => None,
            },
        };
        match exited {
            Some(s) => Checkpointed::JobExited(s),
            None => Checkpointed::Failed(e.into()),
        }
    }

    fn restored_bytes(&mut self, checkpoint: u32) -> Result<u64, HostError> {
        if let Some(s3) = &self.s3 {
            return Ok(s3.taken(checkpoint)?.restored_bytes);
        }
        Ok(stasis_track::touch::restored_bytes(
            &self.store,
            checkpoint,
        )?)
    }

    fn record_touch(
        &mut self,
        checkpoint: u32,
        window: Duration,
    ) -> Result<Self::Touch, HostError> {
        if let Some(s3) = &self.s3 {
            let ts =
                stasis_track::touch::touch_set_of(&s3.taken(checkpoint)?.pids, checkpoint, window)?;
            s3.target.put_touch(checkpoint, &ts)?;
            return Ok(ts);
        }
        Ok(stasis_track::touch::record_now(
            &self.store,
            checkpoint,
            window,
        )?)
    }

    fn reap_orphans(&mut self) {
        reap_orphans();
    }

    fn latest(&mut self) -> Option<u32> {
        match &self.s3 {
            // Only a restart needs to ask the store.
            Some(s3) if !self.o.restart_on_failure => s3.latest.as_ref().map(|t| t.n),
            Some(s3) => s3.target.latest().unwrap_or_else(|e| {
                eprintln!("stasis: warning: {e:#}");
                None
            }),
            None => self.store.latest().ok().flatten(),
        }
    }

    fn restore(&mut self, checkpoint: u32) -> Result<(i32, Self::Restored), HostError> {
        let r = self.restore_now(checkpoint)?;
        self.channel.restored();
        Ok((r.pid, r))
    }

    fn reset_tracking(&mut self) {
        self.tracker = self.new_tracker();
        self.protection = Default::default();
    }

    fn report(&mut self, event: Event<Self::Dump, Self::Touch, Self::Restored>) {
        match event {
            Event::Started { pid } => self.say(
                format!(
                    "job {pid} started ({}), output in {}, tracking with {}",
                    self.o.cmd.join(" "),
                    self.log.display(),
                    self.backend
                ),
                serde_json::json!({"event": "started", "pid": pid, "track": self.backend.name()}),
            ),
            Event::Checkpoint {
                dump,
                interval,
                young,
            } => {
                if let Err(e) = self.say_checkpoint(&dump.0, dump.1.as_ref(), interval, young) {
                    eprintln!(
                        "stasis: warning: reporting checkpoint {}: {e:#}",
                        dump.0.checkpoint
                    );
                }
            }
            Event::CheckpointFailed(e) => {
                eprintln!(
                    "stasis: warning: checkpoint failed (the job runs on): {:#}",
                    anyhow::anyhow!(e)
                );
            }
            Event::TouchSet {
                checkpoint: n,
                result,
            } => match result {
                Ok(ts) => self.say(
                    format!(
                        "touch set of checkpoint {n}: {} pages written in {}",
                        ts.pages(),
                        ui::secs(ts.window_ms * 1000)
                    ),
                    serde_json::json!({"event": "touch_set", "checkpoint": n,
                        "pages": ts.pages(), "window_ms": ts.window_ms}),
                ),
                Err(e) => eprintln!(
                    "stasis: warning: touch set of checkpoint {n}: {:#}",
                    anyhow::anyhow!(e)
                ),
            },
            Event::Exited {
                pid,
                status,
                code,
                why,
            } => self.say_exited(pid, &status, code, why),
            Event::Restored {
                failed_pid,
                status,
                code,
                checkpoint,
                pid,
                restored,
                restart,
            } => {
                self.say_restored(failed_pid, &status, code, checkpoint, &restored, restart);
                ui::forward_signals_to(pid);
            }
        }
    }
}

/// Runs `stasis run`.
pub fn cmd_run(
    o: RunOptions,
    seal: stasis_store::seal::SealOptions,
    replicas: (Vec<stasis_store::S3Image>, usize),
) -> Result<ExitCode> {
    if o.cmd.is_empty() {
        bail!("no command given: stasis run -D DIR --every SECS -- COMMAND [ARGS...]");
    }
    let every = match (o.every.as_str(), o.mtbf) {
        ("auto", Some(mtbf)) => Every::Auto { mtbf },
        ("auto", None) => {
            bail!("--every auto needs --mtbf DURATION (the mean time between failures, e.g. 6h)")
        }
        (s, _) => Every::Fixed(parse_duration(s)?),
    };
    let s3 = match crate::store::s3(&o.dir, seal.clone())? {
        Some(image) => {
            let target = Arc::new(Target::open(image, replicas)?);
            // The store is there, and the credentials work, before the
            // job starts.
            target.latest()?;
            Some(S3Run {
                target,
                seal,
                latest: None,
            })
        }
        None => {
            crate::store::refuse_for_local(&o.dir, &seal, &replicas.0)?;
            None
        }
    };
    let dir = match &s3 {
        Some(s3) => s3.target.staging_dir().to_path_buf(),
        None => o.dir.clone(),
    };
    let store = stasis_image::ImageDir::create_or_open(&dir)
        .with_context(|| format!("opening image directory {}", dir.display()))?;
    let backend = stasis_track::choose(stasis_track::Backend::parse(&o.track)?)?;
    if o.touch_window.is_some() && backend != stasis_track::Backend::Uffd {
        bail!("--touch-window reads the uffd write tracking, but tracking uses {backend} here");
    }
    let protect_tracks = o.concurrent && o.cow_method == stasis_capture::CowMethod::Uffd;
    if protect_tracks && o.touch_window.is_some() {
        bail!("--touch-window reads the WP_ASYNC write tracking: it cannot be used with --cow-method uffd");
    }
    // A new job starts a new chain.
    let _ = stasis_track::state::clear(&dir);
    let config = stasis_supervise::Config {
        every,
        restart: stasis_supervise::RestartPolicy {
            on_failure: o.restart_on_failure,
            max_restarts: o.max_restarts,
        },
        touch_window: o.touch_window.clone(),
    };
    let log = match (&o.log, &s3) {
        (Some(l), _) => l.clone(),
        (None, Some(_)) => dir.parent().unwrap_or(&dir).join("job.log"),
        (None, None) => o.dir.join("job.log"),
    };
    let mut host = Cli {
        o: &o,
        log,
        tracker: stasis_track::tracker(backend, &stasis_track::state::track_dir(&dir)),
        dir,
        store,
        s3,
        backend,
        protect_tracks,
        protection: Default::default(),
        channel: Channel::open().context("making the request channel of the job")?,
    };
    let code = stasis_supervise::supervise(&mut host, config)?;
    Ok(ExitCode::from(code))
}
