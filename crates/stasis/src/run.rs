//! `stasis run`: launch a job and checkpoint it periodically, the first
//! checkpoint full and the next ones incremental, until it exits; restore
//! the latest checkpoint if it crashes (`--restart-on-failure`).

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use crate::ui;

/// Options of `stasis run`.
#[derive(clap::Args)]
pub struct RunOptions {
    /// Image directory (created if missing).
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
    /// File for the job's stdout and stderr (default DIR/job.log).
    #[arg(long)]
    pub log: Option<PathBuf>,
    /// Copy memory while the job runs (from copy-on-write fork snapshots,
    /// dirty pages tracked with --track): it stops only while its state
    /// is read.
    #[arg(long)]
    pub concurrent: bool,
    /// With --concurrent: `uffd` keeps the write-protection of each
    /// concurrent copy as the dirty tracking (each checkpoint protects
    /// again and copies only the 64 KiB grains written since the last;
    /// a write's first fault per grain goes through a handler, which
    /// costs random writers more than --track uffd); `auto` or `fork`:
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
    /// One JSON object per event instead of text lines.
    #[arg(long)]
    pub json: bool,
    /// The command to run.
    #[arg(last = true, required = true)]
    pub cmd: Vec<String>,
}

/// Parses "90", "90s", "15m", "2h", "1d" (also fractions: "0.5s").
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last() {
        Some((i, 's')) => (&s[..i], 1.0),
        Some((i, 'm')) => (&s[..i], 60.0),
        Some((i, 'h')) => (&s[..i], 3600.0),
        Some((i, 'd')) => (&s[..i], 86400.0),
        _ => (s, 1.0),
    };
    let v: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (examples: 90, 90s, 15m, 2h, 1d)"))?;
    if !(v.is_finite() && v > 0.0) {
        return Err(format!("{s:?} must be a positive duration"));
    }
    Ok(Duration::from_secs_f64(v * mult))
}

/// Parses a size: "512" (bytes), "64K", "256M", "1G" (powers of 1024), or
/// "0" for none.
/// Parses `auto`, `uffd` or `fork`.
pub fn parse_cow_method(s: &str) -> Result<stasis_capture::CowMethod, String> {
    use stasis_capture::CowMethod;
    match s {
        "auto" => Ok(CowMethod::Auto),
        "uffd" => Ok(CowMethod::Uffd),
        "fork" => Ok(CowMethod::Fork),
        _ => Err(format!("unknown method {s:?}: use auto, uffd or fork")),
    }
}

pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, mult) = match t.char_indices().last() {
        Some((i, 'k' | 'K')) => (&t[..i], 1u64 << 10),
        Some((i, 'm' | 'M')) => (&t[..i], 1 << 20),
        Some((i, 'g' | 'G')) => (&t[..i], 1 << 30),
        _ => (t, 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|v| v.checked_mul(mult))
        .ok_or_else(|| format!("{s:?} is not a size (examples: 0, 64M, 1G)"))
}

/// Young's first-order optimum checkpoint interval: sqrt(2 C M), for a
/// checkpoint cost C and a mean time between failures M.
pub fn young_interval(cost: Duration, mtbf: Duration) -> Duration {
    let secs = (2.0 * cost.as_secs_f64() * mtbf.as_secs_f64()).sqrt();
    Duration::from_secs_f64(secs.clamp(0.05, mtbf.as_secs_f64().max(0.05)))
}

enum Event {
    Exited(WaitStatus),
    Due,
}

/// Waits until `deadline` or until the job exits, whichever is first.
/// `stasis run` is a child subreaper: processes the job leaves behind (its
/// orphans, a snapshot whose process died mid-dump) are reaped here too.
fn wait_until(pid: i32, deadline: Instant) -> Result<Event> {
    loop {
        loop {
            let flags = WaitPidFlag::WNOHANG | WaitPidFlag::__WALL;
            match waitpid(Pid::from_raw(-1), Some(flags)) {
                Ok(WaitStatus::StillAlive) => break,
                Ok(s @ (WaitStatus::Exited(p, _) | WaitStatus::Signaled(p, _, _)))
                    if p.as_raw() == pid =>
                {
                    return Ok(Event::Exited(s));
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
            return Ok(Event::Due);
        }
        std::thread::sleep((deadline - now).min(Duration::from_millis(10)));
    }
}

/// A raw wait status as nix's `WaitStatus`.
fn wait_status(pid: i32, status: i32) -> WaitStatus {
    WaitStatus::from_raw(Pid::from_raw(pid), status)
        .unwrap_or(WaitStatus::Exited(Pid::from_raw(pid), 1))
}

fn exit_code(s: &WaitStatus) -> (u8, bool) {
    match s {
        WaitStatus::Exited(_, c) => (u8::try_from(*c).unwrap_or(1), *c != 0),
        WaitStatus::Signaled(_, sig, _) => (u8::try_from(128 + *sig as i32).unwrap_or(255), true),
        _ => (1, true),
    }
}

fn describe(s: &WaitStatus) -> String {
    match s {
        WaitStatus::Exited(_, c) => format!("exited with status {c}"),
        WaitStatus::Signaled(_, sig, _) => format!("was killed by {sig}"),
        other => format!("{other:?}"),
    }
}

fn start_job(cmd: &[String], log: &Path) -> Result<i32> {
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("opening the job log {}", log.display()))?;
    let err = out.try_clone().context("duplicating the job log")?;
    let mut c = std::process::Command::new(&cmd[0]);
    c.args(&cmd[1..])
        .stdin(std::process::Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0);
    // SAFETY: the closure runs in the forked child before exec and only
    // calls close_range, which is async-signal-safe: descriptors stasis
    // inherited from its caller must not leak into the job (an image may
    // not hold a pipe shared with a process outside the job).
    unsafe {
        c.pre_exec(|| {
            libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32);
            Ok(())
        });
    }
    let child = c.spawn().with_context(|| format!("starting {}", cmd[0]))?;
    i32::try_from(child.id()).context("pid out of range")
}

/// Runs `stasis run`.
pub fn cmd_run(o: RunOptions) -> Result<ExitCode> {
    if o.cmd.is_empty() {
        bail!("no command given: stasis run -D DIR --every SECS -- COMMAND [ARGS...]");
    }
    let every = match o.every.as_str() {
        "auto" => None,
        s => Some(parse_duration(s).map_err(anyhow::Error::msg)?.as_secs_f64()),
    };
    if every.is_none() && o.mtbf.is_none() {
        bail!("--every auto needs --mtbf DURATION (the mean time between failures, e.g. 6h)");
    }
    let store = stasis_image::ImageDir::create_or_open(&o.dir)
        .with_context(|| format!("opening image directory {}", o.dir.display()))?;
    let backend = stasis_track::choose(stasis_track::Backend::parse(&o.track)?)?;
    if o.touch_window.is_some() && backend != stasis_track::Backend::Uffd {
        bail!("--touch-window reads the uffd write tracking, but tracking uses {backend} here");
    }
    // A new job starts a new chain.
    let _ = stasis_track::state::clear(&o.dir);
    let log = o.log.clone().unwrap_or_else(|| o.dir.join("job.log"));
    // Orphans of the job come to us (and are reaped by `wait_until`).
    nix::sys::prctl::set_child_subreaper(true).context("becoming a child subreaper")?;
    let mut pid = start_job(&o.cmd, &log)?;
    // Ctrl-C, SIGTERM and SIGHUP go to the job (which then exits).
    ui::forward_signals_to(pid);
    let new_tracker = || stasis_track::tracker(backend, &stasis_track::state::track_dir(&o.dir));
    let mut tracker = new_tracker();
    // --concurrent --cow-method uffd: the write-protection of each
    // concurrent copy is kept and is the tracking (only the written grains
    // are protected again and copied at each checkpoint).
    let protect_tracks = o.concurrent && o.cow_method == stasis_capture::CowMethod::Uffd;
    if protect_tracks && o.touch_window.is_some() {
        bail!("--touch-window reads the WP_ASYNC write tracking: it cannot be used with --cow-method uffd");
    }
    let mut protection = stasis_capture::cow::CowTracking::default();
    let say = |line: String, v: serde_json::Value| {
        if o.json {
            println!("{v}");
        } else {
            println!("{line}");
        }
        let _ = std::io::stdout().flush();
    };
    say(
        format!(
            "job {pid} started ({}), output in {}, tracking with {backend}",
            o.cmd.join(" "),
            log.display()
        ),
        serde_json::json!({"event": "started", "pid": pid, "track": backend.name()}),
    );
    let mut interval = match every {
        Some(s) => Duration::from_secs_f64(s),
        None => Duration::from_secs(1), // first checkpoint; then Young's formula
    };
    let mut cost_ewma: Option<f64> = None;
    let mut restarts = 0u32;
    let mut next = Instant::now() + interval;
    // (checkpoint, when its touch window ends, window)
    let mut touch_due: Option<(u32, Instant, Duration)> = None;
    loop {
        let wake = touch_due.map_or(next, |(_, t, _)| t.min(next));
        match wait_until(pid, wake)? {
            Event::Due if touch_due.is_some_and(|(_, t, _)| Instant::now() >= t) => {
                if let Some((n, _, w)) = touch_due.take() {
                    match crate::touch::record_now(&store, n, w) {
                        Ok(ts) => say(
                            format!(
                                "touch set of checkpoint {n}: {} pages written in {}",
                                ts.pages(),
                                ui::secs(ts.window_ms * 1000)
                            ),
                            serde_json::json!({"event": "touch_set", "checkpoint": n,
                                "pages": ts.pages(), "window_ms": ts.window_ms}),
                        ),
                        Err(e) => eprintln!("stasis: warning: touch set of checkpoint {n}: {e:#}"),
                    }
                }
            }
            Event::Due => {
                let opts = stasis_capture::DumpOptions {
                    pid,
                    leave_running: true,
                    progress: None,
                    concurrent: o.concurrent,
                    cow_cap: o.cow_buffer,
                    cow_method: stasis_capture::CowMethod::Auto,
                };
                let dumped = if protect_tracks {
                    stasis_capture::dump_concurrent_tracked(&store, &opts, &mut protection)
                } else {
                    stasis_capture::dump_tracked(&store, &opts, Some(&mut *tracker))
                };
                match dumped {
                    Ok(r) => {
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
                        let cost = r.total_us as f64 / 1e6;
                        let c = cost_ewma.map_or(cost, |e| 0.7 * e + 0.3 * cost);
                        cost_ewma = Some(c);
                        if let (None, Some(m)) = (every, o.mtbf) {
                            interval = young_interval(Duration::from_secs_f64(c), m);
                            line.push_str(&format!(
                                "; next in {:.2} s (Young: sqrt(2 x {:.1} ms x {:.0} s))",
                                interval.as_secs_f64(),
                                c * 1e3,
                                m.as_secs_f64()
                            ));
                        }
                        let mut v = serde_json::to_value(&r)?;
                        v["event"] = "checkpoint".into();
                        v["kind"] = kind.into();
                        v["interval_s"] = interval.as_secs_f64().into();
                        say(line, v);
                        if let Some(spec) = &o.touch_window {
                            let w = crate::touch::window(
                                spec,
                                crate::touch::restored_bytes(&store, r.checkpoint)?,
                                r.total_us,
                                Some(interval.as_secs_f64()),
                            )?;
                            touch_due = w.map(|w| (r.checkpoint, Instant::now() + w, w));
                        }
                    }
                    Err(e) => {
                        // The job may have just exited: the next wait says
                        // so, unless the dump (as its tracer, and we are its
                        // parent) already collected its exit status.
                        let exited = match &e {
                            stasis_capture::CaptureError::Kernel(
                                stasis_kernel::KernelError::Died { pid: p, status, .. },
                            ) if *p == pid => Some(wait_status(pid, *status)),
                            _ => match wait_until(pid, Instant::now()) {
                                Ok(Event::Exited(s)) => Some(s),
                                _ => None,
                            },
                        };
                        if let Some(s) = exited {
                            next = Instant::now();
                            if let Some(code) =
                                handle_exit(&o, &store, &mut pid, &s, &mut restarts, &say)?
                            {
                                return Ok(code);
                            }
                            tracker = new_tracker();
                            protection = Default::default();
                            continue;
                        }
                        eprintln!("stasis: warning: checkpoint failed (the job runs on): {e:#}");
                    }
                }
                next = Instant::now() + interval;
            }
            Event::Exited(s) => {
                if let Some(code) = handle_exit(&o, &store, &mut pid, &s, &mut restarts, &say)? {
                    return Ok(code);
                }
                // Restored: tracking starts over with a full checkpoint.
                tracker = new_tracker();
                protection = Default::default();
                next = Instant::now() + interval;
            }
        }
    }
}

/// The job ended: returns the exit code to leave with, or `None` after a
/// restart from the latest checkpoint (`pid` is then the restored job).
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

fn handle_exit(
    o: &RunOptions,
    store: &stasis_image::ImageDir,
    pid: &mut i32,
    s: &WaitStatus,
    restarts: &mut u32,
    say: &dyn Fn(String, serde_json::Value),
) -> Result<Option<ExitCode>> {
    let (code, failed) = exit_code(s);
    reap_orphans();
    let latest = store.latest().ok().flatten();
    if !(failed && o.restart_on_failure) {
        say(
            format!("job {} {}", *pid, describe(s)),
            serde_json::json!({"event": "exited", "pid": *pid, "code": code}),
        );
        return Ok(Some(ExitCode::from(code)));
    }
    let Some(cp) = latest else {
        say(
            format!(
                "job {} {}; no checkpoint to restart from",
                *pid,
                describe(s)
            ),
            serde_json::json!({"event": "exited", "pid": *pid, "code": code, "restart": false}),
        );
        return Ok(Some(ExitCode::from(code)));
    };
    if *restarts >= o.max_restarts {
        say(
            format!(
                "job {} {}; not restarting: {} restart(s) already (--max-restarts)",
                *pid,
                describe(s),
                *restarts
            ),
            serde_json::json!({"event": "exited", "pid": *pid, "code": code, "restart": false}),
        );
        return Ok(Some(ExitCode::from(code)));
    }
    *restarts += 1;
    let _ = stasis_track::state::clear(&o.dir);
    let filler = if o.lazy_restart {
        Some(crate::restore_cmd::start_filler(
            store.path(),
            cp,
            None,
            (4, 0),
            None,
            None,
        )?)
    } else {
        None
    };
    let restored = stasis_restore::restore(
        store,
        &stasis_restore::RestoreOptions {
            checkpoint: Some(cp),
            lazy: filler.as_ref().map(crate::restore_cmd::sink),
            ..Default::default()
        },
    );
    if let Some(f) = &filler {
        match &restored {
            Ok(_) => f.done().context("telling the page filler the job runs")?,
            Err(_) => f.abort(),
        }
    }
    let r = restored.with_context(|| format!("restoring checkpoint {cp} after the job failed"))?;
    say(
        format!(
            "job {} {}; restored checkpoint {cp} as pid {} in {}{} (restart {} of {})",
            *pid,
            describe(s),
            r.pid,
            ui::secs(r.total_us),
            if r.lazy_bytes > 0 {
                format!(", {} of memory arriving behind it", ui::bytes(r.lazy_bytes))
            } else {
                String::new()
            },
            *restarts,
            o.max_restarts
        ),
        serde_json::json!({"event": "restored", "failed_pid": *pid, "code": code,
            "checkpoint": cp, "pid": r.pid, "restart": *restarts,
            "lazy_bytes": r.lazy_bytes, "total_us": r.total_us}),
    );
    *pid = r.pid;
    ui::forward_signals_to(r.pid);
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("15m").unwrap(), Duration::from_secs(900));
        assert_eq!(parse_duration("2h").unwrap(), Duration::from_secs(7200));
        assert_eq!(parse_duration("0.5s").unwrap(), Duration::from_millis(500));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("-3s").is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("0").unwrap(), 0);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("64K").unwrap(), 64 << 10);
        assert_eq!(parse_size("256M").unwrap(), 256 << 20);
        assert_eq!(parse_size("2g").unwrap(), 2 << 30);
        assert!(parse_size("lots").is_err());
        assert!(parse_size("99999999999G").is_err());
    }

    #[test]
    fn young() {
        // C = 2 s, M = 1 h: sqrt(2 * 2 * 3600) = 120 s.
        let i = young_interval(Duration::from_secs(2), Duration::from_secs(3600));
        assert!((i.as_secs_f64() - 120.0).abs() < 1e-6, "{i:?}");
        // Never longer than the MTBF itself.
        let i = young_interval(Duration::from_secs(100), Duration::from_secs(10));
        assert_eq!(i, Duration::from_secs(10));
    }
}
