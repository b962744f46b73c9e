//! `stasis demo`: the whole story on a built-in workload.
//!
//! The workload is this very binary run as `stasis demo-workload`: a
//! single-threaded loop that mutates a 16 MiB buffer deterministically, prints
//! `tick N sum S` five times a second, and on SIGTERM replays every tick from
//! scratch and checks the buffer byte for byte (PASS/FAIL).

use std::io::{BufRead, BufReader, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

const WORDS: usize = 2 << 20; // 16 MiB of u64
const TOUCH_PER_TICK: u64 = 8192;

fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// Applies tick `t` to the buffer; returns a checksum of what it touched.
fn tick(buf: &mut [u64], t: u64) -> u64 {
    let mut sum = 0u64;
    for j in 0..TOUCH_PER_TICK {
        let i = usize::try_from(mix(t.wrapping_mul(TOUCH_PER_TICK) + j) % buf.len() as u64)
            .unwrap_or(0);
        buf[i] = buf[i].wrapping_add(mix(t ^ (j << 32)));
        sum = sum.wrapping_add(buf[i]);
    }
    sum
}

/// The workload: runs until SIGTERM, then verifies itself.
pub fn workload(pidfile: &Path) -> Result<ExitCode> {
    // Drop whatever fds the launcher's environment leaked to us (a pipe from
    // a job server, say): the workload needs only stdin/stdout/stderr.
    stasis_kernel::launch::close_inherited_fds();
    stasis_kernel::launch::catch_sigterm();
    let mut buf = vec![0u64; WORDS];
    crate::ui::write_pidfile(pidfile, std::process::id() as i32)?;
    let mut t = 0u64;
    let out = std::io::stdout();
    while !stasis_kernel::launch::sigterm_seen() {
        let s = tick(&mut buf, t);
        writeln!(out.lock(), "tick {t} sum {s:016x}")?;
        out.lock().flush()?;
        t += 1;
        std::thread::sleep(Duration::from_millis(200));
    }
    let mut replay = vec![0u64; WORDS];
    for k in 0..t {
        tick(&mut replay, k);
    }
    let mut lock = out.lock();
    if let Some(i) = (0..WORDS).find(|&i| replay[i] != buf[i]) {
        writeln!(
            lock,
            "FAIL: word {i} is {:#x}, a replay of {t} ticks gives {:#x}",
            buf[i], replay[i]
        )?;
        lock.flush()?;
        return Ok(ExitCode::from(1));
    }
    writeln!(lock, "PASS: all 16 MiB match a replay of {t} ticks")?;
    lock.flush()?;
    Ok(ExitCode::SUCCESS)
}

struct Tail {
    file: std::fs::File,
    pos: u64,
    last_tick: Option<u64>,
    lines: Vec<String>,
}

impl Tail {
    fn pump(&mut self) -> Result<()> {
        self.file.seek(SeekFrom::Start(self.pos))?;
        let mut r = BufReader::new(&self.file);
        let mut line = String::new();
        loop {
            line.clear();
            let n = r.read_line(&mut line)?;
            if n == 0 || !line.ends_with('\n') {
                break;
            }
            self.pos += n as u64;
            let l = line.trim_end().to_string();
            println!("    workload | {l}");
            if let Some(t) = l
                .strip_prefix("tick ")
                .and_then(|x| x.split_whitespace().next())
                .and_then(|x| x.parse().ok())
            {
                self.last_tick = Some(t);
            }
            self.lines.push(l);
        }
        Ok(())
    }

    /// The first tick printed after line `seen_before`. On a busy machine
    /// the restored workload may not have ticked yet: it gets up to 30 s
    /// more for its first tick.
    fn first_tick_since(&mut self, seen_before: usize) -> Result<Option<u64>> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.lines[seen_before..]
            .iter()
            .any(|l| l.starts_with("tick "))
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(50));
            self.pump()?;
        }
        Ok(self.lines[seen_before..].iter().find_map(|l| {
            l.strip_prefix("tick ")?
                .split_whitespace()
                .next()?
                .parse::<u64>()
                .ok()
        }))
    }

    fn watch(&mut self, secs: f64) -> Result<()> {
        let end = Instant::now() + Duration::from_secs_f64(secs);
        while Instant::now() < end {
            self.pump()?;
            std::thread::sleep(Duration::from_millis(50));
        }
        self.pump()
    }
}

/// The demo's directory: `dir`, or a new one in the temporary directory.
fn demo_dir(dir: Option<PathBuf>) -> Result<PathBuf> {
    let dir = match dir {
        Some(d) => {
            std::fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
            d
        }
        None => std::env::temp_dir().join(format!("stasis-demo-{}", std::process::id())),
    };
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// Starts `stasis demo-workload` (output appended to `log`).
fn start_workload(log: &Path, pidfile: &Path) -> Result<std::process::Child> {
    let logf = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)?;
    let exe = std::env::current_exe()?;
    Command::new(&exe)
        .arg("demo-workload")
        .arg("--pidfile")
        .arg(pidfile)
        .stdin(Stdio::null())
        .stdout(logf.try_clone()?)
        .stderr(logf)
        .spawn()
        .context("starting the demo workload")
}

/// `stasis demo`.
pub fn run(dir: Option<PathBuf>, before: f64, after: f64) -> Result<ExitCode> {
    // A directory of our own is removed after a successful demo (the image
    // holds the workload's memory); one the user named is kept.
    let own_dir = dir.is_none();
    let dir = demo_dir(dir)?;
    let images = dir.join("images");
    let log = dir.join("workload.log");
    let pidfile = dir.join("workload.pid");
    let _ = std::fs::remove_file(&log);
    let _ = std::fs::remove_file(&pidfile);
    println!(
        "stasis demo: images in {}, workload log {}",
        images.display(),
        log.display()
    );

    let mut child = start_workload(&log, &pidfile)?;
    let pid = wait_pidfile(&pidfile, Duration::from_secs(10))?;
    println!(
        "1. started the workload, pid {pid}; it mutates 16 MiB and prints a tick every 200 ms:"
    );
    let mut tail = Tail {
        file: std::fs::File::open(&log)?,
        pos: 0,
        last_tick: None,
        lines: Vec::new(),
    };
    tail.watch(before)?;

    let store = stasis_image::ImageDir::create_or_open(&images)?;
    let r = stasis_capture::dump(
        &store,
        &stasis_capture::DumpOptions {
            pid,
            leave_running: false,
            progress: None,
            concurrent: false,
            cow_cap: 0,
            cow_method: stasis_capture::CowMethod::Auto,
            cut: None,
            tcp_close: false,
            skip_in_flight: false,
            shm_files: Vec::new(),
            shell_job: false,
        },
    )?;
    let status = child.wait()?;
    tail.pump()?;
    let last = tail.last_tick;
    println!(
        "2. checkpoint {}: {} pages ({}) in {}, frozen {}; the workload was killed ({status}) after tick {}",
        r.checkpoint,
        r.pages,
        crate::ui::bytes(r.bytes),
        crate::ui::secs(r.total_us),
        crate::ui::secs(r.frozen_us),
        last.map_or("none".into(), |t| t.to_string())
    );
    println!("   (for one second nothing runs: pid {pid} is gone)");
    std::thread::sleep(Duration::from_secs(1));

    let restored = stasis_restore::restore(&store, &stasis_restore::RestoreOptions::default())?;
    println!(
        "3. restored pid {} from checkpoint {}: {} pages in {}; it carries on:",
        restored.pid,
        restored.checkpoint,
        restored.pages,
        crate::ui::secs(restored.total_us)
    );
    let seen_before = tail.lines.len();
    tail.watch(after)?;
    let first_after = tail.first_tick_since(seen_before)?;

    // The restored process is our child: its pid cannot have been reused.
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(restored.pid),
        nix::sys::signal::Signal::SIGTERM,
    );
    let code = crate::ui::wait_child(restored.pid, restored.pid)?;
    tail.pump()?;
    let verdict = tail.lines.last().cloned().unwrap_or_default();
    let continued = match (last, first_after) {
        (Some(a), Some(b)) => b == a + 1,
        (None, Some(0)) => true,
        _ => false,
    };
    println!("4. stopped it with SIGTERM; it checked its own memory: {verdict}");
    if continued && code == 0 && verdict.starts_with("PASS") {
        println!(
            "demo OK: the workload resumed at tick {} right after tick {} and its memory is intact",
            first_after.unwrap_or(0),
            last.map_or("-".into(), |t| t.to_string())
        );
        if own_dir {
            let _ = std::fs::remove_dir_all(&dir);
        }
        Ok(ExitCode::SUCCESS)
    } else {
        bail!("demo failed: continued={continued} exit={code} verdict={verdict:?}")
    }
}

fn wait_pidfile(path: &Path, timeout: Duration) -> Result<i32> {
    let t0 = Instant::now();
    loop {
        if let Ok(s) = std::fs::read_to_string(path) {
            if let Ok(p) = s.trim().parse() {
                return Ok(p);
            }
        }
        if t0.elapsed() > timeout {
            bail!(
                "the workload did not write {} within {timeout:?}",
                path.display()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
