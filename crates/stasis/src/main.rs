//! `stasis`: transparent checkpoint/restart for Linux processes.
//!
//! The binary is thin: argument parsing, progress display and output
//! formatting. The work happens in `stasis-capture` and `stasis-restore`.

mod abort;
mod cluster_cmd;
mod cluster_run;
mod demo;
mod gc;
mod page_server;
mod restore_cmd;
mod run;
mod store;
mod store_cluster;
mod ui;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "stasis",
    version,
    about = "Checkpoint a running Linux process to disk and restore it later, exactly where it stopped"
)]
struct Cli {
    /// More log output (-v: info, -vv: debug). STASIS_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    /// With -D s3://...: seal every stored object with the 32-byte key in
    /// FILE (raw, 64 hex digits or base64); restore needs the same key.
    #[arg(long, global = true, value_name = "FILE")]
    encrypt_key_file: Option<PathBuf>,
    /// With -D s3://...: encrypt each checkpoint written under a new data
    /// key wrapped to this age recipient (age1..., repeatable): this host
    /// then cannot read it back; restore needs --decrypt-identity.
    #[arg(long, global = true, value_name = "age1...")]
    encrypt_recipient: Vec<String>,
    /// With -D s3://...: the age recipients in FILE (one a line, #
    /// comments), as --encrypt-recipient (repeatable).
    #[arg(long, global = true, value_name = "FILE")]
    encrypt_recipients_file: Vec<PathBuf>,
    /// With -D s3://...: an age identity file (AGE-SECRET-KEY-1... lines,
    /// repeatable) that opens checkpoints written with --encrypt-recipient.
    #[arg(long, global = true, value_name = "FILE")]
    decrypt_identity: Vec<PathBuf>,
    /// With -D s3://...: a replica store (repeatable). A dump commits only
    /// once every replica (or --min-replicas of them) holds the checkpoint;
    /// restore and inspect read from the first store that has it.
    #[arg(long, global = true, value_name = "s3://BUCKET/PREFIX")]
    replica: Vec<String>,
    /// With --replica: how many replicas must hold a checkpoint for a dump
    /// to commit it (default: all).
    #[arg(long, global = true, value_name = "K")]
    min_replicas: Option<usize>,
    /// With -D s3://...: zstd level of stored objects (0: no compression).
    #[arg(long, global = true, default_value_t = stasis_store::seal::DEFAULT_LEVEL, value_name = "N")]
    compress_level: i32,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Probe the kernel facilities stasis uses; exit 0 if dump/restore can work.
    Check {
        #[arg(long)]
        json: bool,
    },
    /// Checkpoint a process into an image directory.
    Dump {
        /// PID of the process to checkpoint.
        #[arg(short = 't', long = "tree")]
        pid: i32,
        /// Image directory (created if missing), or s3://BUCKET/PREFIX
        /// (configured by AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID,
        /// AWS_SECRET_ACCESS_KEY, AWS_REGION, AWS_ALLOW_HTTP).
        #[arg(short = 'D', long = "images-dir")]
        dir: PathBuf,
        /// Let the process run on after the checkpoint (default: kill it).
        #[arg(long)]
        leave_running: bool,
        /// Track dirty pages: with --leave-running, the next dump into the
        /// same directory saves only the pages written since this one.
        /// Backend: auto (default), uffd, soft-dirty or hash.
        #[arg(long, num_args = 0..=1, default_missing_value = "auto", value_name = "BACKEND")]
        track: Option<String>,
        /// With --leave-running: copy memory while the process runs on; it
        /// stops only while its state is read and its memory
        /// write-protected.
        #[arg(long, requires = "leave_running")]
        concurrent: bool,
        /// With --concurrent: most memory held for pages written before
        /// they were saved; beyond it writers wait for the copy (uffd) or
        /// the process is stopped (fork). 0: no cap.
        #[arg(long, default_value = "256M", value_parser = run::parse_size)]
        cow_buffer: u64,
        /// With --concurrent: how the freeze instant's pages are kept.
        /// `uffd`: userfaultfd write-protection, a handler saves each page
        /// before its first write; `fork`: a copy-on-write fork snapshot;
        /// `auto` (default): uffd, or fork with dirty tracking or when the
        /// process gives back memory not yet saved.
        #[arg(long, default_value = "auto", value_parser = run::parse_cow_method, requires = "concurrent")]
        cow_method: stasis_capture::CowMethod,
        /// With --leave-running: for SECS after the dump (or `auto`: the
        /// time the image takes to retrieve), record which pages the
        /// process writes, as the touch set a lazy restore sends first.
        /// Uses the uffd write tracking of --track.
        #[arg(long, requires = "leave_running", value_name = "SECS|auto")]
        touch_window: Option<String>,
        /// Save established TCP connections as closed: they are neither
        /// stopped nor read (no TCP_REPAIR), and come back closed (as
        /// with `restore --tcp-close`).
        #[arg(long)]
        tcp_close: bool,
        /// Leave out connections waiting in a TCP listener's queue, not yet
        /// accepted (refused by default: they are lost; their clients see
        /// a reset once the listener is restored).
        #[arg(long)]
        skip_in_flight: bool,
        /// Also save the POSIX shared memory objects (files in /dev/shm)
        /// whose names match GLOB (a shell pattern, e.g. 'PostgreSQL.*'),
        /// whole; a restore puts back those that are missing then
        /// (objects a program names in its memory but may free while it
        /// runs on after the dump). Repeatable.
        #[arg(long = "shm-file", value_name = "GLOB")]
        shm_files: Vec<String>,
        /// The process is a job of an interactive shell: its fds on the
        /// shell's terminal (held from outside the tree) are saved as that
        /// terminal, with its settings; `restore --shell-job`, run from a
        /// shell, puts the job on its own terminal, in the foreground if it
        /// was.
        #[arg(long)]
        shell_job: bool,
        #[arg(long)]
        json: bool,
    },
    /// Restore a process from an image directory or a page server.
    Restore(restore_cmd::RestoreArgs),
    /// Serve an image directory to restores on other hosts
    /// (`restore --from ADDR`, with or without --lazy).
    PageServer(page_server::PageServerArgs),
    /// Serve a coordinator on this host: dump, restore and commit the
    /// trees of a distributed job (`stasis cluster`).
    Agent(cluster_cmd::AgentArgs),
    /// Consistent checkpoints of a job spread over several hosts, through
    /// their agents.
    #[command(subcommand)]
    Cluster(cluster_cmd::ClusterCmd),
    /// List the checkpoints of an image directory and verify their checksums.
    Inspect {
        #[arg(short = 'D', long = "images-dir")]
        dir: PathBuf,
        /// Show one checkpoint in detail (mappings, fds, signals).
        #[arg(long)]
        checkpoint: Option<u32>,
        #[arg(long)]
        json: bool,
    },
    /// Delete old checkpoints, keeping the newest N. A kept incremental
    /// checkpoint whose ancestors are deleted is first merged with them
    /// into a full one. Safe to interrupt: run it again to finish.
    Gc {
        /// Image directory.
        #[arg(short = 'D', long = "images-dir")]
        dir: PathBuf,
        /// Number of checkpoints to keep (at least 1).
        #[arg(long, value_name = "N")]
        keep: usize,
        #[arg(long)]
        json: bool,
    },
    /// Run the built-in demo: start a workload, checkpoint it, kill it, restore it.
    Demo {
        /// Where to keep the image and the workload's log (default: a temporary directory).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Seconds the workload runs before the checkpoint.
        #[arg(long, default_value_t = 2.0)]
        before: f64,
        /// Seconds to watch it after the restore.
        #[arg(long, default_value_t = 2.0)]
        after: f64,
    },
    /// PID 1 of a namespace made by `restore --new-pidns`, or the
    /// stand-in init of a tree whose namespace's init was not dumped
    /// (internal).
    #[command(hide = true)]
    PidnsInit {
        #[arg(long)]
        root: i32,
        /// The root stub exists already (forked before the exec).
        #[arg(long)]
        adopt: bool,
    },
    /// The demo's workload (run by `stasis demo`).
    #[command(hide = true)]
    DemoWorkload {
        #[arg(long)]
        pidfile: PathBuf,
    },
    /// Launch a job and checkpoint it periodically (first full, then
    /// incremental) until it exits; exit with the job's status.
    Run(run::RunOptions),
    /// Holds the userfaultfds of a tracked tree between dumps (internal).
    #[command(name = "__track-keeper", hide = true)]
    TrackKeeper { name: String },
    /// Serves the page faults of a lazy restore (internal).
    #[command(name = "__lazy-filler", hide = true)]
    LazyFiller(restore_cmd::FillerCli),
    /// Kills a lazily restored tree if its filler dies (internal).
    #[command(name = "__lazy-guard", hide = true)]
    LazyGuard,
    /// Reaps the fork snapshots of a dumper that was killed (internal).
    #[command(name = "__dump-guard", hide = true)]
    DumpGuard,
    /// Kills a restored tree whose restorer died while letting it go
    /// (internal).
    #[command(name = "__restore-guard", hide = true)]
    RestoreGuard,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    ui::init_tracing(cli.verbose);
    let r = run(cli);
    // A dump being aborted by a signal dies of it once cleaned up.
    abort::settle();
    match r {
        Ok(code) => code,
        Err(e) => {
            let _ = std::io::stdout().flush();
            eprintln!("stasis: error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode> {
    let seal = store::seal_options(
        cli.encrypt_key_file.as_deref(),
        (
            &cli.encrypt_recipient,
            &cli.encrypt_recipients_file,
            &cli.decrypt_identity,
        ),
        cli.compress_level,
    )?;
    if matches!(cli.cmd, Cmd::Dump { .. } | Cmd::Run(_) | Cmd::Agent(_)) {
        store::refuse_identity_alone(&seal)?;
    }
    // An agent opens its replicas itself, once SIGTERM is blocked (a
    // store's client starts threads, which would take the signal).
    let agent = matches!(cli.cmd, Cmd::Agent(_));
    let replicas = match agent {
        true => Vec::new(),
        false => store::replicas(&cli.replica, &seal)?,
    };
    let min_replicas = cli.min_replicas.unwrap_or(cli.replica.len());
    match cli.cmd {
        Cmd::Check { json } => cmd_check(json),
        Cmd::Dump {
            pid,
            dir,
            leave_running,
            track,
            concurrent,
            cow_buffer,
            cow_method,
            touch_window,
            tcp_close,
            skip_in_flight,
            shm_files,
            shell_job,
            json,
        } => match store::s3(&dir, seal.clone())? {
            None => {
                store::refuse_for_local(&dir, &seal, &replicas)?;
                cmd_dump(
                    pid,
                    &dir,
                    (leave_running, concurrent, cow_buffer, cow_method),
                    (tcp_close, skip_in_flight, shm_files, shell_job),
                    (track.as_deref(), touch_window.as_deref(), None),
                    (json, None),
                )
            }
            Some(image) => store::dump(image, (replicas, min_replicas), |dir, cut, sink| {
                cmd_dump(
                    pid,
                    dir,
                    (leave_running, concurrent, cow_buffer, cow_method),
                    (tcp_close, skip_in_flight, shm_files.clone(), shell_job),
                    (track.as_deref(), touch_window.as_deref(), Some(sink)),
                    (json, Some(cut)),
                )
            }),
        },
        Cmd::Restore(a) => restore_cmd::cmd_restore(a, seal, replicas),
        Cmd::PageServer(a) => page_server::cmd_page_server(a, seal, replicas),
        Cmd::Agent(a) => cluster_cmd::cmd_agent(a, seal, (&cli.replica, min_replicas)),
        Cmd::Cluster(c) => cluster_cmd::cmd_cluster(c),
        Cmd::LazyFiller(a) => restore_cmd::cmd_lazy_filler(a, seal),
        Cmd::LazyGuard => restore_cmd::cmd_lazy_guard(),
        Cmd::RestoreGuard => restore_cmd::cmd_restore_guard(),
        Cmd::DumpGuard => {
            stasis_capture::guard::run(std::io::stdin().lock())?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::PidnsInit { root, adopt } => Ok(ExitCode::from(
            u8::try_from(stasis_kernel::child::pidns_init(root, adopt)).unwrap_or(255),
        )),
        Cmd::Inspect {
            dir,
            checkpoint,
            json,
        } => match store::s3(&dir, seal.clone())? {
            None => {
                store::refuse_for_local(&dir, &seal, &replicas)?;
                ui::inspect(&dir, checkpoint, json)
            }
            Some(image) => {
                let tmp = store::fetch_for_inspect(image, replicas, checkpoint)?;
                ui::inspect(&tmp.image(), checkpoint, json)
            }
        },
        Cmd::Gc { dir, keep, json } => gc::cmd_gc(&dir, keep, json, seal, replicas),
        Cmd::Demo { dir, before, after } => demo::run(dir, before, after),
        Cmd::DemoWorkload { pidfile } => demo::workload(&pidfile),
        Cmd::Run(o) => run::cmd_run(o, seal, (replicas, min_replicas)),
        Cmd::TrackKeeper { name } => {
            stasis_track::keeper::serve(&name)?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn cmd_check(json: bool) -> Result<ExitCode> {
    let r = stasis_kernel::probe::probe();
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        println!("kernel {}", r.kernel);
        for f in &r.features {
            let mark = if f.available {
                "ok  "
            } else if f.required {
                "FAIL"
            } else {
                "no  "
            };
            println!("  {mark} {:<24} {}", f.name, f.detail);
            println!("       {:<24} enables: {}", "", f.enables);
            if !f.available {
                println!("       {:<24} without it: {}", "", f.fallback);
            }
        }
        if !r.uffd_features.is_empty() {
            println!("userfaultfd features: {}", r.uffd_features.join(" "));
        }
        println!(
            "{}",
            if r.ok {
                "dump and restore can work here"
            } else {
                "dump and restore CANNOT work here: see FAIL lines"
            }
        );
    }
    Ok(if r.ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn cmd_dump(
    pid: i32,
    dir: &Path,
    (leave_running, concurrent, cow_cap, cow_method): (bool, bool, u64, stasis_capture::CowMethod),
    (tcp_close, skip_in_flight, shm_files, shell_job): (bool, bool, Vec<String>, bool),
    (track, touch_window, touch_sink): (Option<&str>, Option<&str>, Option<store::TouchSink>),
    (json, cut): (bool, Option<std::sync::Arc<dyn stasis_capture::Cut>>),
) -> Result<ExitCode> {
    abort::remove_temps_on_signal(dir)?;
    // A touch window reads the uffd write tracking.
    let track = match (track, touch_window) {
        (None, Some(_)) => Some("uffd"),
        (Some(t), Some(_)) if t != "uffd" && t != "auto" => {
            bail!(
                "--touch-window reads the uffd write tracking; it cannot be used with --track {t}"
            )
        }
        (Some(_), Some(_)) => Some("uffd"),
        (t, None) => t,
    };
    let store = stasis_image::ImageDir::create_or_open(dir)
        .with_context(|| format!("opening image directory {}", dir.display()))?;
    // Tracking: as asked, or as armed by the previous dump into DIR.
    let backend = match track {
        Some(name) => Some(stasis_track::choose_for(
            stasis_track::Backend::parse(name)?,
            pid,
        )?),
        None => stasis_track::state::load(dir)
            .ok()
            .flatten()
            .filter(|s| store.latest().ok().flatten() == Some(s.armed_at))
            .map(|s| s.backend),
    };
    let mut tracker =
        backend.map(|b| stasis_track::tracker(b, &stasis_track::state::track_dir(dir)));
    let progress = ui::Progress::new("dumping");
    let opts = stasis_capture::DumpOptions {
        pid,
        leave_running,
        progress: Some(progress.callback()),
        concurrent,
        cow_cap,
        cow_method,
        cut,
        tcp_close,
        skip_in_flight,
        shm_files,
        shell_job,
    };
    let r = stasis_capture::dump_tracked(&store, &opts, tracker.as_deref_mut())
        .with_context(|| format!("dumping process {pid}"))?;
    progress.finish();
    let mut note = r.note.clone();
    if let Some(t) = tracker.as_mut() {
        let held = t.take_held();
        if !held.is_empty() {
            let exe = stasis_kernel::launch::own_exe();
            if let Err(e) = stasis_track::keeper::hand_over(dir, held, &exe) {
                // Without a holder the areas just registered are untracked
                // again: the next dump saves them whole.
                note = Some(format!("{e}; the next dump will save more pages"));
            }
        }
    }
    if json {
        let mut v = serde_json::to_value(&r)?;
        v["note"] = serde_json::json!(note);
        println!("{v}");
    } else {
        println!("{}", ui::dump_line(&r));
        if let Some(n) = &note {
            println!("note: {n}");
        }
    }
    if let Some(spec) = touch_window {
        match stasis_supervise::touch_window(
            spec,
            stasis_track::touch::restored_bytes(&store, r.checkpoint)?,
            r.total_us,
            None,
        )? {
            None => println!(
                "touch window: off ({} is small enough to restore whole)",
                ui::bytes(r.bytes)
            ),
            Some(w) => {
                let ts = stasis_track::touch::record_window(&store, r.checkpoint, w)
                    .context("recording the touch set")?;
                // In an object store: stored with the checkpoint there.
                let stored = touch_sink.map(|sink| sink(r.checkpoint, &ts)).transpose()?;
                if json {
                    let mut v = serde_json::json!({"touch_window_ms": ts.window_ms, "touch_pages": ts.pages()});
                    if let Some(s) = &stored {
                        v["touch_stored"] = s.as_str().into();
                    }
                    println!("{v}");
                } else {
                    println!(
                        "touch set: {} pages written in {} after checkpoint {}{}",
                        ts.pages(),
                        ui::secs(ts.window_ms * 1000),
                        r.checkpoint,
                        stored.map(|s| format!(" ({s})")).unwrap_or_default()
                    );
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Fails with a clear message when not root (most commands need it).
#[allow(dead_code)]
fn require_root() -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        bail!(
            "stasis needs root (CAP_SYS_PTRACE, CAP_SYS_ADMIN) for this command; run it with sudo"
        );
    }
    Ok(())
}
