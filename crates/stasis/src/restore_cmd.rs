//! `stasis restore`: local or from a page server, whole or lazy; and the
//! lazy restore's filler process (`__lazy-filler`).

use std::io::Write;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use stasis_lazy::{Catalog, Filler, FillerArgs, RunSource};
use stasis_pageserver::MirrorData;

use crate::ui;

/// Options of `stasis restore`.
#[derive(clap::Args, Debug)]
pub struct RestoreArgs {
    /// Image directory or s3://BUCKET/PREFIX (or, with --from, nothing:
    /// the server has the image).
    #[arg(short = 'D', long = "images-dir", required_unless_present = "from")]
    dir: Option<PathBuf>,
    /// Checkpoint number (default: the latest).
    #[arg(long)]
    checkpoint: Option<u32>,
    /// Return once the process runs instead of waiting for it to exit.
    #[arg(short, long)]
    detach: bool,
    /// Write the restored PID to this file.
    #[arg(long)]
    pidfile: Option<PathBuf>,
    /// Seconds to wait for a zombie still holding the PID to be reaped.
    #[arg(long, default_value_t = 10)]
    pid_wait: u64,
    /// Restore into a new PID namespace, where the saved PIDs are free
    /// even if they are taken here.
    #[arg(long)]
    new_pidns: bool,
    /// Bring established TCP connections back closed (a read sees end of
    /// file, a write EPIPE) instead of rebuilding them: for a process
    /// moved where its peers are not. Needs no TCP_REPAIR, and neither
    /// their ports nor their peers.
    #[arg(long)]
    tcp_close: bool,
    /// Restore a shell job (dumped with --shell-job) on the terminal of
    /// this command: its fds on its old terminal are opened on this one,
    /// which gets its terminal settings, and its process group is put in
    /// the foreground if it was. Run it from an interactive shell, without
    /// --detach so the shell waits while the job has the terminal.
    #[arg(long)]
    shell_job: bool,
    /// Start the process before its memory has arrived: private memory is
    /// mapped in as the process touches it (touch set first), and the rest
    /// streams in behind, by a filler process that exits when done.
    #[arg(long)]
    lazy: bool,
    /// Restore from the page server at ADDR (host:port) instead of a local
    /// image directory.
    #[arg(long, value_name = "ADDR", conflicts_with = "dir")]
    from: Option<String>,
    /// File holding the page server's shared token.
    #[arg(long, requires = "from")]
    token_file: Option<PathBuf>,
    /// Threads streaming pages in the background (--lazy).
    #[arg(long, default_value_t = 4, value_name = "N")]
    lazy_threads: usize,
    /// Cap the background streaming of a lazy restore at this many bytes
    /// per second (e.g. 100M), to spare the disk or link; faults are
    /// always served at once.
    #[arg(long, value_name = "RATE", value_parser = crate::run::parse_size, requires = "lazy")]
    lazy_bandwidth: Option<u64>,
    /// With --detach: append the page filler's messages (a failed fetch
    /// and the tree it killed) to this file; without it they are lost once
    /// the restore has returned (the statistics file still says).
    #[arg(long, value_name = "FILE", requires = "lazy")]
    lazy_log: Option<PathBuf>,
    /// Write the filler's statistics (faults, latencies, fill time) here as
    /// JSON when it is done (--lazy).
    #[arg(long, value_name = "FILE", requires = "lazy")]
    lazy_stats: Option<PathBuf>,
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    transport: crate::page_server::TransportArgs,
}

/// Starts the page filler of a lazy restore of checkpoint `n` of the image
/// at `dir` (pages from the page server `from` if given, else from `dir`).
pub fn start_filler(
    dir: &Path,
    n: u32,
    from: Option<(String, PathBuf)>,
    (threads, bandwidth): (usize, u64),
    log: Option<Option<PathBuf>>,
    stats_file: Option<PathBuf>,
) -> Result<Filler> {
    let args = filler_args(dir, n, from, (threads, bandwidth), log, stats_file);
    spawn_filler(&args)
}

/// Starts the page filler of a lazy restore of checkpoint `n` of the
/// sparse copy at `dir` of the object store at `url` (the filler reads the
/// pages there).
pub fn start_store_filler(
    dir: &Path,
    n: u32,
    (url, others): (&str, &[String]),
    seal: &stasis_store::seal::SealOptions,
) -> Result<Filler> {
    let mut args = filler_args(dir, n, None, (4, 0), None, None);
    from_store(&mut args, (url, others), seal);
    spawn_filler(&args)
}

/// The filler reads its pages from the object store at `url`; the fault
/// order it records goes there and to the stores `others` (the primary
/// and replicas other than `url`) that hold the checkpoint.
fn from_store(
    args: &mut FillerArgs,
    (url, others): (&str, &[String]),
    seal: &stasis_store::seal::SealOptions,
) {
    // The local copy is temporary: the fault order goes to the store.
    args.record_faults = false;
    args.extra.extend(["--store".into(), url.to_string()]);
    for o in others.iter().filter(|o| *o != url) {
        args.extra.extend(["--touch-copy".into(), o.clone()]);
    }
    if let Some(k) = &seal.key {
        args.extra.push("--encrypt-key-file".into());
        args.extra.push(k.file.to_string_lossy().into_owned());
    }
    for f in seal.identities.iter().flat_map(|i| &i.files) {
        args.extra.push("--decrypt-identity".into());
        args.extra.push(f.to_string_lossy().into_owned());
    }
}

fn spawn_filler(args: &FillerArgs) -> Result<Filler> {
    let exe = stasis_kernel::launch::own_exe();
    Filler::spawn(&exe, args).context("starting the lazy restore's page filler")
}

/// The filler's options (its transport is this process's).
fn filler_args(
    dir: &Path,
    n: u32,
    from: Option<(String, PathBuf)>,
    (threads, bandwidth): (usize, u64),
    log: Option<Option<PathBuf>>,
    stats_file: Option<PathBuf>,
) -> FillerArgs {
    let plaintext = stasis_pageserver::tls::Transport::process_default()
        == stasis_pageserver::tls::Transport::InsecurePlaintext;
    FillerArgs {
        dir: dir.to_path_buf(),
        checkpoint: n,
        record_faults: from.is_none(),
        from,
        threads: threads.max(1),
        stats_file,
        bandwidth,
        log,
        extra: if plaintext {
            vec!["--insecure-plaintext".into()]
        } else {
            Vec::new()
        },
    }
}

/// The restorer's lazy sink for `filler`.
pub fn sink(filler: &Filler) -> Box<dyn stasis_restore::LazySink> {
    Box::new(stasis_lazy::FillerSink(filler.clone()))
}

/// Copies the page server's image into a temporary directory, with a
/// progress bar.
fn fetch_mirror(
    addr: &str,
    token: &[u8],
    n: Option<u32>,
    data: MirrorData,
) -> Result<stasis_pageserver::TempMirror> {
    let progress = ui::Progress::new("fetching");
    let cb = progress.callback();
    let m = stasis_pageserver::mirror_to_temp(addr, token, n, data, Some(&|a, b| cb(a, b)))
        .with_context(|| format!("fetching the image from the page server at {addr}"))?;
    progress.finish();
    Ok(m)
}

pub fn cmd_restore(
    a: RestoreArgs,
    seal: stasis_store::seal::SealOptions,
    replicas: Vec<stasis_store::S3Image>,
) -> Result<ExitCode> {
    a.transport.apply();
    // Where the image is: local, a private copy of an object store's
    // checkpoints (sparse for a lazy restore: the filler reads the rest
    // from `lazy_store`), or a local mirror of the page server's.
    let mut lazy_store = None;
    let mut lazy_store_copies = Vec::new();
    let urls: Vec<String> = replicas.iter().map(|r| r.url.clone()).collect();
    let fetched = match a
        .dir
        .as_deref()
        .map(|d| crate::store::s3(d, seal.clone()))
        .transpose()?
    {
        Some(Some(image)) => {
            if a.lazy {
                let mut urls = urls;
                urls.insert(0, image.url.clone());
                lazy_store_copies = urls;
                let (t, url) = crate::store::fetch_lazy(image, replicas, a.checkpoint)?;
                lazy_store = Some(url);
                Some(t)
            } else {
                Some(crate::store::fetch(image, replicas, a.checkpoint)?)
            }
        }
        Some(None) => {
            let dir = a.dir.as_deref().unwrap_or(Path::new(""));
            crate::store::refuse_for_local(dir, &seal, &replicas)?;
            None
        }
        None => None,
    };
    let (dir, checkpoint, _mirror) = match &fetched {
        Some(t) => (t.image(), t.fetched.chain.first().copied(), None),
        None => locate_image(&a)?,
    };
    let store = stasis_image::ImageDir::open(&dir)
        .with_context(|| format!("opening image directory {}", dir.display()))?;
    let filler = if a.lazy {
        let n = match checkpoint {
            Some(n) => n,
            None => store
                .latest()?
                .context("the image directory has no checkpoint")?,
        };
        let mut args = filler_args(
            &dir,
            n,
            a.from.clone().zip(a.token_file.clone()),
            (a.lazy_threads, a.lazy_bandwidth.unwrap_or(0)),
            a.detach.then(|| a.lazy_log.clone()),
            a.lazy_stats.clone(),
        );
        if let Some(url) = &lazy_store {
            from_store(&mut args, (url, &lazy_store_copies), &seal);
        }
        Some(spawn_filler(&args)?)
    } else {
        None
    };
    let progress = ui::Progress::new("restoring");
    let opts = stasis_restore::RestoreOptions {
        checkpoint,
        pid_wait: Duration::from_secs(a.pid_wait),
        progress: Some(progress.callback()),
        new_pidns: a.new_pidns,
        lazy: filler.as_ref().map(sink),
        cut: None,
        tcp_close: a.tcp_close,
        shell_job: a.shell_job,
    };
    let r = run_restore(&store, &opts, filler.as_ref())?;
    progress.finish();
    if let Some(pf) = &a.pidfile {
        if let Err(e) = ui::write_pidfile(pf, r.pid) {
            // The process runs; say so rather than leaving it unaccounted for.
            eprintln!(
                "stasis: warning: restored pid {} but could not write {}: {e}",
                r.pid,
                pf.display()
            );
        }
    }
    report(&a, &r, filler.as_ref())?;
    let _ = std::io::stdout().flush();
    // A lazy restore from a page server: the filler has the indexes it
    // needs in memory, and the eager pages are in the process.
    drop(_mirror);
    drop(fetched);
    if a.detach {
        return Ok(ExitCode::SUCCESS);
    }
    // With a new PID namespace, its init (our child) exits with the root's status.
    let status = ui::wait_child(r.init_pid.unwrap_or(r.pid), r.pid)?;
    Ok(ExitCode::from(status))
}

/// The image directory and checkpoint to restore: `-D DIR`, or a local
/// mirror of the page server's image (kept until the returned guard drops;
/// sparse for a lazy restore, with the eager pages fetched into it).
fn locate_image(
    a: &RestoreArgs,
) -> Result<(PathBuf, Option<u32>, Option<stasis_pageserver::TempMirror>)> {
    let token = match &a.token_file {
        Some(f) => Some(crate::page_server::read_token_file(f)?),
        None if a.from.is_some() => bail!(
            "--from needs --token-file: the page server only serves clients that know its token"
        ),
        None => None,
    };
    match (&a.from, &a.dir) {
        (Some(addr), _) => {
            let token = token.as_deref().unwrap_or_default();
            let data = if a.lazy {
                MirrorData::Sparse
            } else {
                MirrorData::Full
            };
            let m = fetch_mirror(addr, token, a.checkpoint, data)?;
            let (dir, n) = (m.image(), m.checkpoint);
            if a.lazy {
                stasis_lazy::fill_eager(addr, token, &dir, n)?;
            }
            Ok((dir, Some(n), Some(m)))
        }
        (None, Some(d)) => Ok((d.clone(), a.checkpoint, None)),
        (None, None) => bail!("give an image directory (-D DIR) or a page server (--from ADDR)"),
    }
}

/// How long a failed lazy restore waits for the filler's reason (it kills
/// the tree, then says why: on a busy machine that can take a moment).
const FILLER_REASON_WAIT: Duration = Duration::from_secs(3);

/// Restores; with a filler, tells it the tree runs, or on failure aborts it
/// and reports its own reason if it had one.
fn run_restore(
    store: &stasis_image::ImageDir,
    opts: &stasis_restore::RestoreOptions,
    filler: Option<&Filler>,
) -> Result<stasis_restore::Restored> {
    let r = match stasis_restore::restore(store, opts) {
        Ok(r) => r,
        Err(e) => {
            // If the filler killed the tree under construction (a damaged
            // run, say), its reason is the one that matters.
            let cause = filler.and_then(|f| f.failure(FILLER_REASON_WAIT));
            if let Some(f) = filler {
                f.abort();
            }
            if let Some(c) = cause {
                return Err(anyhow::Error::new(e).context(c)).context("restore failed");
            }
            return Err(e).context("restore failed");
        }
    };
    if let Some(f) = filler {
        // The tree runs: from here the filler finishes on its own.
        if let Err(e) = f.done() {
            // The filler is gone: it killed the tree (its guard does if it
            // died), for a reason it may have said.
            let e = anyhow::Error::new(e).context("telling the page filler the tree runs");
            return Err(match f.failure(FILLER_REASON_WAIT) {
                Some(cause) => e.context(cause),
                None => e,
            });
        }
    }
    Ok(r)
}

/// Prints what was restored (one JSON object with --json).
fn report(a: &RestoreArgs, r: &stasis_restore::Restored, filler: Option<&Filler>) -> Result<()> {
    if a.json {
        let mut v = serde_json::to_value(r)?;
        if let Some(f) = filler {
            v["filler_pid"] = f.pid.into();
        }
        println!("{v}");
        return Ok(());
    }
    let waited = if r.pid_wait_us >= 1000 {
        format!(
            " (of which {} waiting for the PID to be released)",
            ui::secs(r.pid_wait_us)
        )
    } else {
        String::new()
    };
    let ns = r
        .pid_in_namespace
        .map(|p| format!(" (PID {p} in a new PID namespace)"))
        .unwrap_or_default();
    let lazy = filler
        .map(|f| {
            format!(
                "; {} left to the page filler (pid {}), which maps pages in as they are touched and streams the rest",
                ui::bytes(r.lazy_bytes),
                f.pid
            )
        })
        .unwrap_or_default();
    println!(
        "restored pid {}{ns} from checkpoint {}: {} pages, {} in {}{waited}{lazy}",
        r.pid,
        r.checkpoint,
        r.pages,
        ui::bytes(r.bytes),
        ui::secs(r.total_us)
    );
    Ok(())
}

/// Options of the lazy filler (started by `restore --lazy`).
#[derive(clap::Args, Debug)]
pub struct FillerCli {
    #[arg(long)]
    dir: PathBuf,
    #[arg(long)]
    checkpoint: u32,
    #[arg(long, default_value_t = 4)]
    threads: usize,
    #[arg(long)]
    from: Option<String>,
    #[arg(long, requires = "from")]
    token_file: Option<PathBuf>,
    #[arg(long)]
    stats_file: Option<PathBuf>,
    #[arg(long)]
    record_faults: bool,
    #[arg(long, default_value_t = 0)]
    bandwidth: u64,
    /// Read the pages from this object store (s3://...) rather than from
    /// the packs of --dir (a sparse copy of its chain).
    #[arg(long, conflicts_with = "from")]
    store: Option<String>,
    /// With --store: another store (a replica, or the primary) that also
    /// gets the fault order if it holds the checkpoint (repeatable).
    #[arg(long, requires = "store")]
    touch_copy: Vec<String>,
    #[command(flatten)]
    transport: crate::page_server::TransportArgs,
}

pub fn cmd_lazy_filler(a: FillerCli, seal: stasis_store::seal::SealOptions) -> Result<ExitCode> {
    a.transport.apply();
    let control = std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .context("taking the control socket")?;
    let started = Instant::now();
    let setup = || -> Result<(Catalog, Box<dyn RunSource>)> {
        let catalog = Catalog::load(&a.dir, a.checkpoint)?;
        let remote = match (&a.from, &a.token_file) {
            (Some(addr), Some(tf)) => {
                Some((addr.as_str(), crate::page_server::read_token_file(tf)?))
            }
            _ => None,
        };
        // A page server or store that is not there fails now, not at the
        // first fault.
        let source: Box<dyn RunSource> = match &a.store {
            Some(url) => Box::new(crate::store::S3Runs::open(url, seal.clone(), a.checkpoint)?),
            None => stasis_lazy::open_source(&a.dir, remote)?,
        };
        Ok((catalog, source))
    };
    let (catalog, source) = match setup() {
        Ok(x) => x,
        Err(e) => {
            let _ = stasis_lazy::control::send(
                control.as_fd(),
                &stasis_lazy::control::Msg::Error(format!("{e:#}")),
                None,
            );
            return Err(e);
        }
    };
    let cp_dir = stasis_image::ImageDir::open(&a.dir)?
        .load(Some(a.checkpoint))?
        .dir()
        .to_path_buf();
    let exe = stasis_kernel::launch::own_exe();
    let order = stasis_image::touch::priority_order(&cp_dir);
    // (Reported: how many pages the touch sets put first.)
    let touch_pages: usize = order.values().map(Vec::len).sum();
    let cfg = stasis_lazy::Config {
        threads: a.threads,
        order,
        bandwidth: a.bandwidth,
        guard: Some(stasis_lazy::guard::Guard::spawn(&exe)?),
    };
    let result = stasis_lazy::serve(control, catalog, source, cfg);
    let touch = result
        .as_ref()
        .ok()
        .and_then(stasis_lazy::Stats::fault_touch_set);
    match (touch, &a.store) {
        // From an object store: stored with the checkpoint there (the
        // local copy is temporary).
        (Some(ts), Some(url)) => {
            if let Err(e) = crate::store::put_touch(url, seal.clone(), a.checkpoint, &ts) {
                eprintln!("stasis: warning: could not record the fault order: {e:#}");
            }
            crate::store::put_touch_copies(&a.touch_copy, &seal, a.checkpoint, &ts);
        }
        (Some(ts), None) if a.record_faults => {
            if let Err(e) = stasis_image::touch::write_touch_set(&cp_dir, &ts) {
                eprintln!("stasis: warning: could not record the fault order: {e}");
            }
        }
        _ => {}
    }
    if let Some(path) = &a.stats_file {
        let total_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(0);
        let mut v = stasis_lazy::Stats::report(&result, total_us);
        v["touch_pages"] = touch_pages.into();
        std::fs::write(path, format!("{v}\n"))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    match result {
        Ok(_) => Ok(ExitCode::SUCCESS),
        Err(e) => {
            eprintln!("stasis: {e}");
            Ok(ExitCode::FAILURE)
        }
    }
}

/// The lazy filler's guard (`__lazy-guard`): see `stasis_lazy::guard`.
pub fn cmd_restore_guard() -> Result<ExitCode> {
    let sock = std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .context("taking the guard socket")?;
    match stasis_restore::guard::run(sock)? {
        stasis_restore::guard::Outcome::Killed(pids) if !pids.is_empty() => {
            eprintln!(
                "stasis: the restorer died while letting the restored tree go; its processes {pids:?} were killed, so that no part of the tree runs without the rest"
            );
            Ok(ExitCode::FAILURE)
        }
        _ => Ok(ExitCode::SUCCESS),
    }
}

pub fn cmd_lazy_guard() -> Result<ExitCode> {
    let sock = std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .context("taking the guard socket")?;
    let killed = stasis_lazy::guard::run(sock)?;
    if killed.is_empty() {
        return Ok(ExitCode::SUCCESS);
    }
    eprintln!(
        "stasis: the page filler of a lazy restore died before every page had arrived; the restored tree ({} processes: {killed:?}) was killed, since running on would have meant reading zeros instead of its memory",
        killed.len()
    );
    Ok(ExitCode::FAILURE)
}
