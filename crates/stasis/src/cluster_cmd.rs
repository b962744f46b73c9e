//! `stasis agent` and `stasis cluster dump|restore|inspect`: consistent
//! checkpoints of an application spread over several hosts (see
//! `stasis_cluster::protocol` for the protocol).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use stasis_cluster::storage::{LocalStorage, Storage};
use stasis_cluster::{agent, coordinator};

use crate::page_server::{read_token_file, TransportArgs};

/// `stasis agent --listen ADDR --token-file F -D DIR`.
#[derive(clap::Args, Debug)]
pub struct AgentArgs {
    /// Address to listen on for coordinators (port 0 picks a free port,
    /// printed at start).
    #[arg(long)]
    pub listen: String,
    /// File holding the secret token shared with the coordinators.
    #[arg(long)]
    pub token_file: PathBuf,
    /// This host's stable storage: the checkpoints of its trees, by job (a
    /// directory, or an object store, s3://BUCKET/PREFIX).
    #[arg(short = 'D', long = "images-dir")]
    pub dir: PathBuf,
    /// The name this agent gives coordinators (default: the hostname).
    #[arg(long)]
    pub name: Option<String>,
    /// Print the listening address as one JSON object.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub transport: TransportArgs,
}

/// Serves until SIGTERM or SIGINT, then exits 0.
pub fn cmd_agent(
    a: AgentArgs,
    seal: stasis_store::seal::SealOptions,
    (replica_urls, min_replicas): (&[String], usize),
) -> Result<ExitCode> {
    a.transport.apply();
    let token = read_token_file(&a.token_file)?;
    let host = match a.name.clone() {
        Some(n) => n,
        None => std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "localhost".into()),
    };
    // SIGTERM and SIGINT end the agent between sessions' steps: blocked in
    // every thread, waited for by one.
    let mut sigs = nix::sys::signal::SigSet::empty();
    sigs.add(nix::sys::signal::Signal::SIGTERM);
    sigs.add(nix::sys::signal::Signal::SIGINT);
    sigs.thread_block().context("blocking SIGTERM")?;
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        std::thread::spawn(move || {
            if let Ok(s) = sigs.wait() {
                eprintln!("stasis agent: {s:?}: stopping");
            }
            stop.store(true, Ordering::Relaxed);
        });
    }
    // (Opened with SIGTERM blocked: a store's client starts threads.)
    let replicas = (crate::store::replicas(replica_urls, &seal)?, min_replicas);
    // Its local directory (decisions, logs) and where its trees' checkpoints go.
    let (dir, storage): (PathBuf, Arc<dyn Storage>) = match crate::store::s3(&a.dir, seal.clone())?
    {
        None => {
            crate::store::refuse_for_local(&a.dir, &seal, &replicas.0)?;
            std::fs::create_dir_all(&a.dir)
                .with_context(|| format!("creating the agent's directory {}", a.dir.display()))?;
            (a.dir.clone(), Arc::new(LocalStorage::new(&a.dir)))
        }
        Some(image) => {
            let s = crate::store_cluster::S3Agent::open(image, replicas, seal, &host)?;
            (s.local_dir(), Arc::new(s))
        }
    };
    // What a previous run left: commits decided and not done.
    for line in storage
        .recover()
        .with_context(|| format!("recovering the jobs under {}", a.dir.display()))?
    {
        eprintln!("stasis agent: {line}");
    }
    let listener = std::net::TcpListener::bind(&a.listen)
        .with_context(|| format!("listening on {}", a.listen))?;
    let addr = listener.local_addr()?;
    {
        let mut out = std::io::stdout().lock();
        if a.json {
            let v = serde_json::json!({
                "listening": addr.to_string(),
                "host": host,
                "dir": storage.describe(),
            });
            writeln!(out, "{v}")?;
        } else {
            writeln!(
                out,
                "agent {host}: listening on {addr}, storage {}",
                storage.describe()
            )?;
        }
        out.flush()?;
    }
    agent::serve(
        listener,
        agent::AgentConfig {
            token,
            dir,
            storage,
            host,
        },
        &stop,
    )
    .context("serving coordinators")?;
    Ok(ExitCode::SUCCESS)
}

/// What every `stasis cluster` command names: the token and the job.
#[derive(clap::Args, Debug)]
pub struct JobArgs {
    /// File holding the secret token shared with the agents.
    #[arg(long)]
    pub token_file: PathBuf,
    /// The job's name (its checkpoints are kept under it by each agent).
    #[arg(long)]
    pub job: String,
    /// Print the result as one JSON object.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub transport: TransportArgs,
}

/// `stasis cluster ...`.
#[derive(clap::Subcommand, Debug)]
pub enum ClusterCmd {
    /// Take one consistent checkpoint of a job over all its hosts.
    Dump {
        #[command(flatten)]
        j: JobArgs,
        /// AGENT=PID: a tree of the job (root PID) on the host whose agent
        /// listens at AGENT (HOST:PORT). Repeat for every tree.
        #[arg(long = "target", required = true, value_parser = coordinator::parse_target)]
        targets: Vec<(String, i32)>,
        /// Let the job run on after the checkpoint (else it is killed once
        /// the checkpoint is committed on every host).
        #[arg(long)]
        leave_running: bool,
        /// Copy memory while the job runs (with --leave-running).
        #[arg(long, requires = "leave_running")]
        concurrent: bool,
        /// Incremental: each agent keeps a dirty tracker per tree from this
        /// round to the next (with --leave-running).
        #[arg(long, requires = "leave_running")]
        track: bool,
    },
    /// Checkpoint a running job periodically (concurrent, incremental after
    /// the first round) until every tree of it has exited.
    Run {
        #[command(flatten)]
        j: JobArgs,
        /// AGENT=PID: a tree of the job (root PID) on the host whose agent
        /// listens at AGENT (HOST:PORT). Repeat for every tree.
        #[arg(long = "target", required = true, value_parser = coordinator::parse_target)]
        targets: Vec<(String, i32)>,
        /// Seconds between rounds (90, 90s, 15m...), or `auto` for Young's
        /// interval over the measured round time (needs --mtbf).
        #[arg(long, value_name = "SECS|auto")]
        every: String,
        /// Mean time between failures, for --every auto (e.g. 6h, 30m).
        #[arg(long, value_parser = stasis_supervise::parse_duration)]
        mtbf: Option<std::time::Duration>,
        /// Keep the job frozen while its memory is copied (default: it runs).
        #[arg(long)]
        stop_the_world: bool,
        /// Full checkpoints every round (default: incremental after the first).
        #[arg(long)]
        no_track: bool,
    },
    /// Restore a job on all its hosts from its newest complete checkpoint.
    Restore {
        #[command(flatten)]
        j: JobArgs,
        /// AGENT (HOST:PORT) of a host of the job; repeat for every host.
        #[arg(long = "target", required = true)]
        targets: Vec<String>,
        /// The round to restore (default: the newest that every tree holds).
        #[arg(long)]
        checkpoint: Option<u64>,
        /// Run each tree as soon as it is built, its memory filled in on
        /// demand and in the background (a page filler per tree).
        #[arg(long)]
        lazy: bool,
    },
    /// List the rounds of a job each agent holds, and the complete ones.
    Inspect {
        #[command(flatten)]
        j: JobArgs,
        /// AGENT (HOST:PORT) of a host of the job; repeat for every host.
        #[arg(long = "target", required = true)]
        targets: Vec<String>,
    },
}

pub fn cmd_cluster(c: ClusterCmd) -> Result<ExitCode> {
    let (ClusterCmd::Dump { j, .. }
    | ClusterCmd::Run { j, .. }
    | ClusterCmd::Restore { j, .. }
    | ClusterCmd::Inspect { j, .. }) = &c;
    j.transport.apply();
    match c {
        ClusterCmd::Dump {
            j:
                JobArgs {
                    token_file,
                    job,
                    json,
                    ..
                },
            targets,
            leave_running,
            concurrent,
            track,
        } => {
            let token = read_token_file(&token_file)?;
            let req = coordinator::DumpRequest {
                job: job.clone(),
                targets,
                leave_running,
                concurrent,
                track,
            };
            let r = coordinator::dump(&req, &token)
                .with_context(|| format!("cluster checkpoint of job {job}"))?;
            if json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                let trees: usize = r.hosts.iter().map(|h| h.checkpoints.len()).sum();
                println!(
                    "job {}: round {} committed on {} hosts ({trees} trees); hosts froze within {:.1} ms, done in {:.1} ms",
                    r.job,
                    r.round,
                    r.hosts.len(),
                    r.freeze_us as f64 / 1e3,
                    r.total_us as f64 / 1e3
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        ClusterCmd::Run {
            j:
                JobArgs {
                    token_file,
                    job,
                    json,
                    ..
                },
            targets,
            every,
            mtbf,
            stop_the_world,
            no_track,
        } => {
            let token = read_token_file(&token_file)?;
            let req = crate::cluster_run::RunRequest {
                every: crate::cluster_run::parse_every(&every, mtbf)?,
                job: job.clone(),
                targets,
                concurrent: !stop_the_world,
                track: !no_track,
                json,
            };
            crate::cluster_run::run(&req, &token)
                .with_context(|| format!("periodic cluster checkpoints of job {job}"))
        }
        ClusterCmd::Restore {
            j:
                JobArgs {
                    token_file,
                    job,
                    json,
                    ..
                },
            targets,
            checkpoint,
            lazy,
        } => {
            let token = read_token_file(&token_file)?;
            let r = coordinator::restore(&job, &targets, checkpoint, lazy, &token)
                .with_context(|| format!("cluster restore of job {job}"))?;
            if json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                println!(
                    "job {}: round {} restored on {} hosts in {:.1} ms: {:?}",
                    r.job,
                    r.round,
                    r.hosts.len(),
                    r.total_us as f64 / 1e3,
                    r.hosts
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        ClusterCmd::Inspect { j, targets } => inspect(&j, &targets),
    }
}

/// `stasis cluster inspect`: the rounds each agent holds, and the complete
/// ones.
fn inspect(j: &JobArgs, targets: &[String]) -> Result<ExitCode> {
    let (token_file, job, json) = (&j.token_file, &j.job, j.json);
    let token = read_token_file(token_file)?;
    let mut agents = targets
        .iter()
        .map(|a| coordinator::connect(a, &token))
        .collect::<Result<Vec<_>, _>>()?;
    let held = coordinator::inspect(&mut agents, job)?;
    let complete = coordinator::complete_rounds(&held);
    if json {
        let v = serde_json::json!({"job": job, "agents": held, "complete": complete});
        println!("{v}");
    } else {
        for a in &held {
            for t in &a.trees {
                let rounds: Vec<u64> = t.rounds.iter().map(|r| r.0).collect();
                println!(
                    "{} ({}): tree {}: rounds {rounds:?}",
                    a.agent, a.host, t.pid
                );
            }
            if a.trees.is_empty() {
                println!("{} ({}): no tree of job {job}", a.agent, a.host);
            }
        }
        println!("complete rounds (restorable): {complete:?}");
    }
    if held.iter().all(|a| a.trees.is_empty()) {
        bail!("no agent holds a checkpoint of job {job}");
    }
    Ok(ExitCode::SUCCESS)
}
