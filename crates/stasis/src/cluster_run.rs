//! `stasis cluster run`: periodic consistent checkpoints of a running job
//! over all its hosts, until every tree of it has exited. Each round is
//! one `cluster dump --leave-running` (concurrent, and incremental after
//! the first unless asked otherwise); a round that fails (a host
//! unreachable, a dump refused) is reported and the job runs on from the
//! previous cut, and the next round comes at the next interval. Between
//! rounds the coordinator asks the agents which trees still run
//! (`Status`); once a tree has exited no new round starts (the job is
//! ending), and the command ends when none runs.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use stasis_cluster::coordinator::{self, CutReport, DumpRequest};
use stasis_supervise::policy::Schedule;
use stasis_supervise::Every;

/// How often the agents are asked whether the trees still run.
const POLL: Duration = Duration::from_millis(500);

/// What `stasis cluster run` was asked.
pub struct RunRequest {
    pub job: String,
    pub targets: Vec<(String, i32)>,
    pub every: Every,
    pub concurrent: bool,
    pub track: bool,
    pub json: bool,
}

/// Bytes written by a round, and whether every tree's checkpoint was
/// incremental.
fn figures(r: &CutReport) -> (u64, bool) {
    let reports = r.hosts.iter().flat_map(|h| h.reports.iter());
    let bytes = reports.clone().filter_map(|v| v["bytes"].as_u64()).sum();
    let incremental = reports.clone().count() > 0 && reports.clone().all(|v| v["parent"].is_u64());
    (bytes, incremental)
}

fn say(json: bool, line: String, v: serde_json::Value) {
    if json {
        println!("{v}");
    } else {
        println!("{line}");
    }
    use std::io::Write;
    let _ = std::io::stdout().flush();
}

/// Runs rounds until every tree has exited (then exits 0, whatever the
/// rounds did: each is reported as it ends).
pub fn run(req: &RunRequest, token: &[u8]) -> Result<ExitCode> {
    let mut schedule = Schedule::new(req.every);
    let (mut committed, mut failed) = (0u64, 0u64);
    let mut next = Instant::now() + schedule.interval();
    let dump = DumpRequest {
        job: req.job.clone(),
        targets: req.targets.clone(),
        leave_running: true,
        concurrent: req.concurrent,
        track: req.track,
    };
    loop {
        let running = coordinator::alive(&req.job, &req.targets, token)?;
        if running.is_empty() {
            break;
        }
        let now = Instant::now();
        if running.len() < req.targets.len() || now < next {
            // Waiting for the interval, or for the rest of an ending job.
            std::thread::sleep(
                POLL.min(next.saturating_duration_since(now))
                    .max(Duration::from_millis(50)),
            );
            continue;
        }
        match coordinator::dump(&dump, token) {
            Ok(r) => {
                committed += 1;
                let young = schedule.checkpointed(r.total_us);
                let (bytes, incremental) = figures(&r);
                let interval = schedule.interval();
                say(
                    req.json,
                    format!(
                        "job {}: round {} committed on {} hosts ({}, {:.1} MiB), hosts froze within {:.1} ms, done in {:.1} ms; next in {:.1} s",
                        r.job,
                        r.round,
                        r.hosts.len(),
                        if incremental { "incremental" } else { "full" },
                        bytes as f64 / f64::from(1u32 << 20),
                        r.freeze_us as f64 / 1e3,
                        r.total_us as f64 / 1e3,
                        interval.as_secs_f64()
                    ),
                    serde_json::json!({
                        "event": "checkpoint", "job": r.job, "round": r.round,
                        "hosts": r.hosts, "freeze_us": r.freeze_us, "total_us": r.total_us,
                        "bytes": bytes, "incremental": incremental,
                        "interval_s": interval.as_secs_f64(),
                        "young_cost_s": young.map(|y| y.cost_secs),
                    }),
                );
            }
            Err(e) => {
                failed += 1;
                say(
                    req.json,
                    format!(
                        "job {}: a round failed, the job runs on from its previous cut: {e}",
                        req.job
                    ),
                    serde_json::json!({"event": "failed", "job": req.job, "error": e.to_string()}),
                );
            }
        }
        next = Instant::now() + schedule.interval();
    }
    say(
        req.json,
        format!(
            "job {}: every tree has exited; {committed} rounds committed, {failed} failed",
            req.job
        ),
        serde_json::json!({"event": "done", "job": req.job, "committed": committed, "failed": failed}),
    );
    Ok(ExitCode::SUCCESS)
}

/// `--every SECS|auto` with `--mtbf`.
pub fn parse_every(every: &str, mtbf: Option<Duration>) -> Result<Every> {
    Ok(match (every, mtbf) {
        ("auto", Some(mtbf)) => Every::Auto { mtbf },
        ("auto", None) => {
            bail!("--every auto needs --mtbf DURATION (the mean time between failures, e.g. 6h)")
        }
        (s, _) => Every::Fixed(stasis_supervise::parse_duration(s)?),
    })
}
