//! The coordinator (`stasis cluster dump|restore|inspect`): drives every
//! agent of a job through one round of the protocol ([`crate::protocol`]),
//! moving all of them to the next phase only when all have finished the
//! last, and aborting all of them on the first failure before the decision.

use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::protocol::{Conn, DumpOrder, Msg, RestoreOrder, TreeRounds};
use crate::ClusterError;

/// How long the coordinator waits for an agent's answer in any phase (a
/// dump of a large tree takes a while between `Release` and `Written`).
const PHASE_TIMEOUT: Duration = Duration::from_secs(600);

/// A connected, authenticated agent.
pub struct Agent {
    /// As given (`HOST:PORT`).
    pub addr: String,
    /// The name it gave.
    pub host: String,
    conn: Conn,
}

/// Connects to the agent at `addr` and authenticates with `token`.
pub fn connect(addr: &str, token: &[u8]) -> Result<Agent, ClusterError> {
    let to_err = |source| ClusterError::Connect {
        peer: addr.to_string(),
        source,
    };
    let sa = addr
        .to_socket_addrs()
        .map_err(to_err)?
        .next()
        .ok_or_else(|| to_err(std::io::Error::from(std::io::ErrorKind::NotFound)))?;
    let s = TcpStream::connect_timeout(&sa, Duration::from_secs(10)).map_err(to_err)?;
    let _ = s.set_nodelay(true);
    s.set_read_timeout(Some(PHASE_TIMEOUT)).map_err(to_err)?;
    let mut conn = Conn::new(s, addr.to_string());
    let host = conn.authenticate_to_agent(token)?;
    Ok(Agent {
        addr: addr.to_string(),
        host,
        conn,
    })
}

/// The trees of `job` on one agent and their committed rounds.
#[derive(Debug, Clone, Serialize)]
pub struct AgentRounds {
    pub agent: String,
    pub host: String,
    pub trees: Vec<TreeRounds>,
}

/// Asks every agent which rounds of `job` it holds.
pub fn inspect(agents: &mut [Agent], job: &str) -> Result<Vec<AgentRounds>, ClusterError> {
    let mut out = Vec::new();
    for a in agents.iter_mut() {
        a.conn.send(&Msg::Inspect { job: job.into() })?;
        match a.conn.expect()? {
            Msg::Jobs { trees } => out.push(AgentRounds {
                agent: a.addr.clone(),
                host: a.host.clone(),
                trees,
            }),
            other => return Err(a.conn.unexpected(&other, "the job's rounds")),
        }
    }
    Ok(out)
}

/// Which of `targets` (agent `HOST:PORT`, tree root) still run: one
/// `Status` request per agent.
pub fn alive(
    job: &str,
    targets: &[(String, i32)],
    token: &[u8],
) -> Result<Vec<(String, i32)>, ClusterError> {
    let mut out = Vec::new();
    for (addr, pids) in by_agent(targets) {
        let mut a = connect(&addr, token)?;
        a.conn.send(&Msg::Status {
            job: job.into(),
            pids: pids.clone(),
        })?;
        match a.conn.expect()? {
            Msg::Alive { pids: live } => out.extend(
                pids.into_iter()
                    .filter(|p| live.contains(p))
                    .map(|p| (addr.clone(), p)),
            ),
            Msg::Error { message } => {
                return Err(ClusterError::Peer {
                    peer: addr,
                    message,
                })
            }
            other => return Err(a.conn.unexpected(&other, "which trees run")),
        }
    }
    Ok(out)
}

/// The rounds every tree of every agent holds (complete cuts), oldest
/// first.
pub fn complete_rounds(rounds: &[AgentRounds]) -> Vec<u64> {
    let mut trees = rounds.iter().flat_map(|a| a.trees.iter());
    let Some(first) = trees.next() else {
        return Vec::new();
    };
    let mut common: Vec<u64> = first.rounds.iter().map(|r| r.0).collect();
    for t in trees {
        common.retain(|r| t.rounds.iter().any(|x| x.0 == *r));
    }
    common.sort_unstable();
    common.dedup();
    common
}

/// What one host did in a round.
#[derive(Debug, Clone, Serialize)]
pub struct HostCut {
    pub agent: String,
    pub host: String,
    /// Longest time from the agent's start of the round to a tree frozen.
    pub frozen_us: u64,
    /// (tree root, checkpoint number).
    pub checkpoints: Vec<(i32, u32)>,
    /// Each tree's dump report.
    pub reports: Vec<serde_json::Value>,
}

/// A committed cluster checkpoint.
#[derive(Debug, Clone, Serialize)]
pub struct CutReport {
    pub job: String,
    pub round: u64,
    pub hosts: Vec<HostCut>,
    /// From the first `Dump` sent to the last `Frozen` received: how long
    /// the slowest host took to freeze (the job stops from each host's
    /// freeze until `Release`).
    pub freeze_us: u64,
    /// From the first `Dump` to the last `Committed`.
    pub total_us: u64,
}

/// One cluster dump.
#[derive(Debug, Clone)]
pub struct DumpRequest {
    pub job: String,
    /// (agent `HOST:PORT`, tree root PID); several per agent allowed.
    pub targets: Vec<(String, i32)>,
    pub leave_running: bool,
    pub concurrent: bool,
    /// Incremental: each agent keeps a dirty tracker per tree between
    /// rounds (with `leave_running`).
    pub track: bool,
}

/// Parses `AGENT=PID` (a `--target` of `cluster dump`).
pub fn parse_target(s: &str) -> Result<(String, i32), ClusterError> {
    let bad = |why: &str| ClusterError::BadTarget(format!("{s:?}: {why}"));
    let (agent, pid) = s
        .rsplit_once('=')
        .ok_or_else(|| bad("expected AGENT=PID, e.g. 10.0.0.2:7700=1234"))?;
    let pid: i32 = pid
        .parse()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| bad(&format!("{pid:?} is not a PID")))?;
    if agent.is_empty() {
        return Err(bad("no agent address before '='"));
    }
    Ok((agent.to_string(), pid))
}

/// The agents of `targets`, in order of first appearance, each with its
/// trees.
fn by_agent(targets: &[(String, i32)]) -> Vec<(String, Vec<i32>)> {
    let mut out: Vec<(String, Vec<i32>)> = Vec::new();
    for (a, pid) in targets {
        match out.iter_mut().find(|(x, _)| x == a) {
            Some((_, pids)) => pids.push(*pid),
            None => out.push((a.clone(), vec![*pid])),
        }
    }
    out
}

/// Sends `m` to every agent.
fn broadcast(agents: &mut [Agent], m: &Msg) -> Result<(), ClusterError> {
    for a in agents.iter_mut() {
        a.conn.send(m)?;
    }
    Ok(())
}

/// Reads one answer from every agent; `want` picks the expected one.
fn gather<T>(
    agents: &mut [Agent],
    what: &str,
    mut want: impl FnMut(Msg) -> Option<T>,
) -> Result<Vec<T>, ClusterError> {
    let mut out = Vec::new();
    for a in agents.iter_mut() {
        let m = a.conn.expect()?;
        match want(m.clone()) {
            Some(t) => out.push(t),
            None => return Err(a.conn.unexpected(&m, what)),
        }
    }
    Ok(out)
}

/// Aborts the round on every agent (best effort: some may be gone), and
/// returns `e`.
fn abort_all(agents: &mut [Agent], e: ClusterError) -> ClusterError {
    let why = e.to_string();
    for a in agents.iter_mut() {
        let _ = a.conn.send(&Msg::Abort { why: why.clone() });
    }
    e
}

/// Takes one consistent cut of the job: the three phases of the protocol
/// over every agent of `req.targets`. On a failure before the decision,
/// every agent aborts and the previous cut stays.
pub fn dump(req: &DumpRequest, token: &[u8]) -> Result<CutReport, ClusterError> {
    crate::jobs::check_job(&req.job)?;
    let groups = by_agent(&req.targets);
    let mut agents = groups
        .iter()
        .map(|(a, _)| connect(a, token))
        .collect::<Result<Vec<_>, _>>()?;
    let held = inspect(&mut agents, &req.job)?;
    let round = held
        .iter()
        .flat_map(|a| a.trees.iter())
        .flat_map(|t| t.rounds.iter().map(|r| r.0))
        .max()
        .unwrap_or(0)
        + 1;
    // The job's hosts, as the coordinator reaches their agents.
    let hosts: Vec<std::net::IpAddr> = agents
        .iter()
        .filter_map(|a| a.conn.stream().peer_addr().ok())
        .map(|sa| sa.ip())
        .collect();
    let t0 = Instant::now();
    for (a, (_, pids)) in agents.iter_mut().zip(&groups) {
        a.conn.send(&Msg::Dump(DumpOrder {
            job: req.job.clone(),
            round,
            pids: pids.clone(),
            leave_running: req.leave_running,
            concurrent: req.concurrent,
            track: req.track,
            hosts: hosts.clone(),
        }))?;
    }
    die_point();
    // Phase 0: all ready; then all freeze at once.
    let ready = gather(&mut agents, "ready", |m| (m == Msg::Ready).then_some(()))
        .and_then(|_| broadcast(&mut agents, &Msg::Freeze));
    if let Err(e) = ready {
        return Err(abort_all(&mut agents, e));
    }
    die_point();
    // Phase 1: all frozen.
    let frozen = gather(&mut agents, "frozen", |m| match m {
        Msg::Frozen { frozen_us } => Some(frozen_us),
        _ => None,
    });
    let frozen = match frozen {
        Ok(f) => f,
        Err(e) => return Err(abort_all(&mut agents, e)),
    };
    let freeze_us = micros(t0);
    // Phase 2: all released; phase 3: all written.
    let written = broadcast(&mut agents, &Msg::Release).and_then(|()| {
        die_point();
        gather(&mut agents, "written", |m| match m {
            Msg::Written { checkpoints } => Some(checkpoints),
            _ => None,
        })
    });
    let written = match written {
        Ok(w) => w,
        Err(e) => return Err(abort_all(&mut agents, e)),
    };
    // The decision: from here every agent commits, even if we die.
    broadcast(&mut agents, &Msg::Commit)?;
    die_point();
    let reports = gather(&mut agents, "committed", |m| match m {
        Msg::Committed { reports } => Some(reports),
        _ => None,
    })?;
    let hosts = agents
        .iter()
        .zip(frozen)
        .zip(written)
        .zip(reports)
        .map(|(((a, frozen_us), checkpoints), reports)| HostCut {
            agent: a.addr.clone(),
            host: a.host.clone(),
            frozen_us,
            checkpoints,
            reports,
        })
        .collect();
    Ok(CutReport {
        job: req.job.clone(),
        round,
        hosts,
        freeze_us,
        total_us: micros(t0),
    })
}

/// A restored job.
#[derive(Debug, Clone, Serialize)]
pub struct RestoreReport {
    pub job: String,
    pub round: u64,
    /// (agent, the roots of its restored trees).
    pub hosts: Vec<(String, Vec<i32>)>,
    pub total_us: u64,
}

/// Restores the job on every agent of `agents` (`HOST:PORT`), from `round`
/// or the newest complete one (`lazy`: memory filled in while it runs):
/// every tree built before any runs, or none left.
pub fn restore(
    job: &str,
    agent_addrs: &[String],
    round: Option<u64>,
    lazy: bool,
    token: &[u8],
) -> Result<RestoreReport, ClusterError> {
    crate::jobs::check_job(job)?;
    let mut agents = agent_addrs
        .iter()
        .map(|a| connect(a, token))
        .collect::<Result<Vec<_>, _>>()?;
    let held = inspect(&mut agents, job)?;
    if let Some(a) = held.iter().find(|a| a.trees.is_empty()) {
        return Err(ClusterError::Refused(format!(
            "the agent at {} ({}) holds no checkpoint of job {job}",
            a.agent, a.host
        )));
    }
    let complete = complete_rounds(&held);
    let round = match round {
        Some(r) if complete.contains(&r) => r,
        Some(r) => {
            return Err(ClusterError::Refused(format!(
                "round {r} of job {job} is not held by every tree (complete rounds: {complete:?})"
            )))
        }
        None => *complete.last().ok_or_else(|| {
            ClusterError::Refused(format!(
                "job {job} has no round that every tree holds: nothing consistent to restore"
            ))
        })?,
    };
    let t0 = Instant::now();
    broadcast(
        &mut agents,
        &Msg::Restore(RestoreOrder {
            job: job.into(),
            round,
            pids: Vec::new(),
            lazy,
        }),
    )?;
    let built = gather(&mut agents, "built", |m| {
        matches!(m, Msg::Built).then_some(())
    });
    if let Err(e) = built {
        return Err(abort_all(&mut agents, e));
    }
    broadcast(&mut agents, &Msg::Go)?;
    let running = gather(&mut agents, "running", |m| match m {
        Msg::Running { pids } => Some(pids),
        _ => None,
    })?;
    Ok(RestoreReport {
        job: job.into(),
        round,
        hosts: agents.iter().map(|a| a.addr.clone()).zip(running).collect(),
        total_us: micros(t0),
    })
}

/// Test hook: the coordinator dies here on the pass `STASIS_FAULT` names.
fn die_point() {
    stasis_sys::fault::die_at(stasis_sys::fault::Point::DieInClusterRound);
}

fn micros(t0: Instant) -> u64 {
    u64::try_from(t0.elapsed().as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tr(pid: i32, rounds: &[u64]) -> TreeRounds {
        TreeRounds {
            pid,
            rounds: rounds
                .iter()
                .map(|&r| (r, u32::try_from(r).unwrap()))
                .collect(),
        }
    }

    #[test]
    fn a_round_is_complete_only_if_every_tree_of_every_agent_holds_it() {
        let held = vec![
            AgentRounds {
                agent: "a".into(),
                host: "h1".into(),
                trees: vec![tr(1, &[1, 2, 3]), tr(2, &[2, 3])],
            },
            AgentRounds {
                agent: "b".into(),
                host: "h2".into(),
                // Round 3 committed here only in part: the coordinator died.
                trees: vec![tr(3, &[1, 2])],
            },
        ];
        assert_eq!(complete_rounds(&held), vec![2]);
        assert!(complete_rounds(&[]).is_empty());
    }

    #[test]
    fn targets_parse_as_agent_and_pid() {
        assert_eq!(
            parse_target("10.0.0.2:7700=1234").unwrap(),
            ("10.0.0.2:7700".to_string(), 1234)
        );
        for bad in ["10.0.0.2:7700", "=5", "a:1=x", "a:1=-3", "a:1=0"] {
            assert!(parse_target(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn targets_are_grouped_by_agent_in_order() {
        let t = vec![
            ("b:1".to_string(), 5),
            ("a:1".to_string(), 6),
            ("b:1".to_string(), 7),
        ];
        assert_eq!(
            by_agent(&t),
            vec![
                ("b:1".to_string(), vec![5, 7]),
                ("a:1".to_string(), vec![6])
            ]
        );
    }
}
