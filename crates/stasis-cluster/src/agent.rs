//! The agent (`stasis agent`): one per host, it dumps, restores and
//! commits the trees of its host on a coordinator's orders (the protocol is
//! specified in [`crate::protocol`]). Each connection is one session, served
//! by a thread of its own; each tree of a round by a thread of its own,
//! which stops at the cut's barriers ([`stasis_capture::Cut`],
//! [`stasis_restore::RestoreCut`]) until the session thread, on the
//! coordinator's word, lets it go on or abort.

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use stasis_image::manifest::{CutAbort, CutMark};
use stasis_image::ImageDir;

use crate::jobs::{self, Decision};
use crate::protocol::{Conn, DumpOrder, Msg, RestoreOrder};
use crate::storage::{RestoreSource, Storage};
use crate::trackers;
use crate::ClusterError;

/// How long an agent waits for the coordinator's word in a round before
/// it aborts (the coordinator waits as long for the slowest host).
const ROUND_TIMEOUT: Duration = Duration::from_secs(600);

/// How an agent runs.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// The secret shared with the coordinators.
    pub token: Vec<u8>,
    /// Its local directory: the decisions of its rounds, the page
    /// fillers' logs (`-D DIR`, or a directory of its own for a store).
    pub dir: PathBuf,
    /// Where the checkpoints of its trees are kept.
    pub storage: Arc<dyn Storage>,
    /// Its name, as told to coordinators.
    pub host: String,
}

/// Serves coordinators on `listener` until `stop` is set (checked every
/// 100 ms). Call [`jobs::recover`] first, before saying the agent is
/// ready: it finishes the commits a previous run left.
pub fn serve(
    listener: TcpListener,
    cfg: AgentConfig,
    stop: &AtomicBool,
) -> Result<(), ClusterError> {
    listener
        .set_nonblocking(true)
        .map_err(|source| ClusterError::Io {
            what: "listen on",
            path: cfg.dir.clone(),
            source,
        })?;
    let cfg = Arc::new(cfg);
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((s, peer)) => {
                let cfg = cfg.clone();
                std::thread::spawn(move || {
                    let _ = s.set_nonblocking(false);
                    let peer = peer.to_string();
                    if let Err(e) = session(s, peer.clone(), &cfg) {
                        tracing::warn!("session with {peer}: {e}");
                    }
                });
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => tracing::warn!("accept: {e}"),
        }
    }
    Ok(())
}

fn session(s: TcpStream, peer: String, cfg: &AgentConfig) -> Result<(), ClusterError> {
    let mut c = Conn::new(s, peer);
    if !c.authenticate_coordinator(&cfg.token, &cfg.host)? {
        tracing::warn!("{}: refused a coordinator with another token", c.peer);
        return Ok(());
    }
    while let Some(m) = c.recv()? {
        match m {
            Msg::Inspect { job } => {
                let r = jobs::check_job(&job).and_then(|()| cfg.storage.rounds(&job));
                match r {
                    Ok(trees) => c.send(&Msg::Jobs { trees })?,
                    Err(e) => c.send(&Msg::Error {
                        message: e.to_string(),
                    })?,
                }
            }
            Msg::Status { job, pids } => match jobs::check_job(&job) {
                Ok(()) => c.send(&Msg::Alive {
                    pids: pids
                        .into_iter()
                        .filter(|&p| crate::identity::runs_as_seen(&job, p))
                        .collect(),
                })?,
                Err(e) => c.send(&Msg::Error {
                    message: e.to_string(),
                })?,
            },
            Msg::Dump(order) => {
                let _one = one_round_at_a_time();
                dump_round(&mut c, cfg, &order)?;
                if !order.leave_running {
                    trackers::drop_job(&order.job);
                    crate::identity::forget_job(&order.job);
                }
            }
            Msg::Restore(order) => {
                let _one = one_round_at_a_time();
                // The restored trees start a new chain.
                trackers::drop_job(&order.job);
                restore_round(&mut c, cfg, &order)?;
            }
            other => c.send(&Msg::Error {
                message: format!("unexpected request {other:?}"),
            })?,
        }
    }
    Ok(())
}

/// Rounds run one at a time on an agent: a round whose coordinator died
/// is still putting its trees back (or removing its tentative checkpoint)
/// when the next coordinator comes; the next waits for it, rather than
/// finding the trees traced or their image directories locked, or
/// changing sockets the other is putting back.
fn one_round_at_a_time() -> MutexGuard<'static, ()> {
    static ROUND: Mutex<()> = Mutex::new(());
    ROUND
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Why a round is abandoned, or a tree of it failed (the message the
/// coordinator gets).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
struct Why(String);

/// What the session thread and the tree threads of one round share.
#[derive(Default)]
struct Round {
    st: Mutex<RoundState>,
    cv: Condvar,
}

#[derive(Default)]
struct RoundState {
    /// Trees ready to freeze (a dump).
    at_ready: usize,
    /// The coordinator's word once every host is ready (`Err`: abort).
    freeze: Option<Result<(), Why>>,
    /// Trees at the first barrier (frozen, or built).
    at_first: usize,
    /// (tree root, checkpoint) of the trees at the second barrier.
    written: Vec<(i32, u32)>,
    frozen_us: u64,
    /// The first error of a tree's thread.
    failed: Option<Why>,
    /// The coordinator's word at each barrier (`Err`: abort, why).
    first: Option<Result<(), Why>>,
    second: Option<Result<(), Why>>,
}

impl Round {
    fn lock(&self) -> MutexGuard<'_, RoundState> {
        self.st
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Waits until `done` holds; returns the state.
    fn wait_for(&self, done: impl Fn(&RoundState) -> bool) -> MutexGuard<'_, RoundState> {
        let mut st = self.lock();
        while !done(&st) {
            st = self
                .cv
                .wait(st)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        st
    }

    /// A tree thread at a barrier: records itself, waits for the word.
    fn barrier(
        &self,
        arrive: impl FnOnce(&mut RoundState),
        word: impl Fn(&RoundState) -> Option<Result<(), Why>>,
    ) -> Result<(), CutAbort> {
        {
            let mut st = self.lock();
            arrive(&mut st);
        }
        self.cv.notify_all();
        let st = self.wait_for(|s| word(s).is_some());
        word(&st).unwrap_or(Ok(())).map_err(|w| CutAbort(w.0))
    }

    /// The coordinator's word on every host being ready to freeze.
    fn say_freeze(&self, word: Result<(), Why>) {
        self.lock().freeze.get_or_insert(word);
        self.cv.notify_all();
    }

    fn say(&self, first: Option<Result<(), Why>>, second: Option<Result<(), Why>>) {
        {
            let mut st = self.lock();
            if let Some(Err(why)) = &first {
                st.freeze.get_or_insert(Err(why.clone()));
            }
            if first.is_some() && st.first.is_none() {
                st.first = first;
            }
            if second.is_some() && st.second.is_none() {
                st.second = second;
            }
        }
        self.cv.notify_all();
    }

    fn end(&self, err: Option<Why>) {
        {
            let mut st = self.lock();
            if let Some(e) = err {
                st.failed.get_or_insert(e);
            }
        }
        self.cv.notify_all();
    }
}

/// The part of a cut one tree's dump plays.
struct DumpPart {
    round: Arc<Round>,
    mark: CutMark,
    pid: i32,
    t0: std::time::Instant,
    storage: Arc<dyn Storage>,
    /// What the storage said it stored at the commit.
    stored: Mutex<Option<serde_json::Value>>,
}

impl stasis_capture::Cut for DumpPart {
    fn mark(&self) -> CutMark {
        self.mark.clone()
    }
    fn ready(&self) -> Result<(), CutAbort> {
        self.round
            .barrier(|st| st.at_ready += 1, |st| st.freeze.clone())
    }
    fn frozen(&self) -> Result<(), CutAbort> {
        let us = u64::try_from(self.t0.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.round.barrier(
            |st| {
                st.at_first += 1;
                st.frozen_us = st.frozen_us.max(us);
            },
            |st| st.first.clone(),
        )
    }
    fn written(&self, checkpoint: u32) -> Result<(), CutAbort> {
        let (pid, job) = (self.pid, &self.mark.job);
        // Stored (invisible) before the vote: a failure is a no.
        self.storage
            .stage(job, pid, checkpoint)
            .map_err(|e| CutAbort(format!("storing the checkpoint: {e}")))?;
        self.round.barrier(
            |st| st.written.push((pid, checkpoint)),
            |st| st.second.clone(),
        )?;
        // Decided: visible in the storage, then committed locally.
        let stored = self
            .storage
            .commit(job, pid, checkpoint)
            .map_err(|e| CutAbort(format!("committing the checkpoint: {e}")))?;
        if let Ok(mut g) = self.stored.lock() {
            *g = stored;
        }
        Ok(())
    }
}

/// One round of a cluster dump on this host (see the protocol).
fn dump_round(c: &mut Conn, cfg: &AgentConfig, o: &DumpOrder) -> Result<(), ClusterError> {
    if let Err(e) = jobs::check_job(&o.job) {
        return c.send(&Msg::Failed {
            error: e.to_string(),
        });
    }
    if let Some(why) = o
        .pids
        .iter()
        .find_map(|&pid| crate::identity::check_or_learn(&o.job, pid))
    {
        return c.send(&Msg::Failed { error: why });
    }
    match crate::peers::outside_peers(&o.pids, &o.hosts) {
        Ok(bad) if bad.is_empty() => {}
        Ok(bad) => {
            return c.send(&Msg::Failed {
                error: format!("connections outside job {}: {}", o.job, bad.join("; ")),
            })
        }
        Err(e) => {
            return c.send(&Msg::Failed {
                error: e.to_string(),
            })
        }
    }
    // A coordinator that hangs must not keep the trees frozen for ever.
    let _ = c.stream().set_read_timeout(Some(ROUND_TIMEOUT));
    let round = Arc::new(Round::default());
    let n = o.pids.len();
    let threads = spawn_dumps(cfg, o, &round);
    // Phase 0: every tree ready to freeze, or one failed; then every host
    // freezes at the coordinator's word.
    let st = round.wait_for(|s| s.at_ready >= n || s.failed.is_some());
    let failed = st.failed.clone();
    drop(st);
    if let Some(why) = failed {
        return abort_round(c, &round, threads, why);
    }
    let word = say_then_hear(c, &Msg::Ready, Msg::Freeze);
    match word {
        Ok(()) => round.say_freeze(Ok(())),
        Err(why) => return abort_round(c, &round, threads, why),
    }
    // Phase 1: every tree frozen, or one failed.
    let failed = {
        let st = round.wait_for(|s| s.at_first == n || s.failed.is_some());
        st.failed
            .clone()
            .map(|f| (f, st.frozen_us))
            .ok_or(st.frozen_us)
    };
    let reports = match failed {
        Ok((why, _)) => return abort_round(c, &round, threads, why),
        Err(frozen_us) => {
            let word = say_then_hear(c, &Msg::Frozen { frozen_us }, Msg::Release);
            match word {
                Ok(()) => round.say(Some(Ok(())), None),
                Err(why) => return abort_round(c, &round, threads, why),
            }
            // Phase 3: every tentative checkpoint written, or one failed.
            let st = round.wait_for(|s| s.written.len() == n || s.failed.is_some());
            if let Some(why) = st.failed.clone() {
                drop(st);
                return abort_round(c, &round, threads, why);
            }
            let mut checkpoints = st.written.clone();
            drop(st);
            checkpoints.sort_unstable();
            let word = say_then_hear(
                c,
                &Msg::Written {
                    checkpoints: checkpoints.clone(),
                },
                Msg::Commit,
            );
            if let Err(why) = word {
                return abort_round(c, &round, threads, why);
            }
            // The decision, durable before anything is committed.
            let d = Decision {
                round: o.round,
                checkpoints,
            };
            if let Err(e) = jobs::record_decision(&cfg.dir, &o.job, &d) {
                return abort_round(c, &round, threads, Why(e.to_string()));
            }
            stasis_sys::fault::die_at(stasis_sys::fault::Point::DieAfterDecision);
            round.say(None, Some(Ok(())));
            threads
                .into_iter()
                .map(|t| {
                    t.join()
                        .unwrap_or_else(|_| Err(Why("a dump thread panicked".into())))
                })
                .collect::<Vec<_>>()
        }
    };
    let mut out = Vec::new();
    for r in reports {
        match r {
            Ok(v) => out.push(v),
            Err(e) => {
                return c.send(&Msg::Failed {
                    error: format!("committing: {e}"),
                })
            }
        }
    }
    c.send(&Msg::Committed { reports: out })
}

/// One thread per tree of the round, each dumping it as one part of the
/// cut (stopping at the round's barriers).
fn spawn_dumps(
    cfg: &AgentConfig,
    o: &DumpOrder,
    round: &Arc<Round>,
) -> Vec<std::thread::JoinHandle<Result<serde_json::Value, Why>>> {
    let mut threads = Vec::new();
    for &pid in &o.pids {
        let part = Arc::new(DumpPart {
            round: round.clone(),
            mark: CutMark {
                job: o.job.clone(),
                round: o.round,
            },
            pid,
            t0: std::time::Instant::now(),
            storage: cfg.storage.clone(),
            stored: Mutex::new(None),
        });
        let storage = cfg.storage.clone();
        let job = o.job.clone();
        let (leave_running, concurrent) = (o.leave_running, o.concurrent);
        let track = o.track && leave_running;
        let r2 = round.clone();
        threads.push(std::thread::spawn(move || {
            let res = storage
                .dump_dir(&job, pid)
                .and_then(|dir| Ok(ImageDir::create_or_open(&dir)?))
                .and_then(|store| {
                    let opts = stasis_capture::DumpOptions {
                        pid,
                        leave_running,
                        concurrent,
                        cut: Some(part.clone()),
                        ..Default::default()
                    };
                    if track {
                        trackers::dump_tracked(&job, &store, &opts)
                    } else {
                        Ok(stasis_capture::dump(&store, &opts)?)
                    }
                });
            storage.tidy(&job, pid, res.is_ok());
            let res = res.map(|rep| {
                let mut v = serde_json::to_value(rep).unwrap_or_default();
                let stored = part.stored.lock().ok().and_then(|mut g| g.take());
                if let (Some(s), Some(m)) = (stored, v.as_object_mut()) {
                    m.insert("stored".into(), s);
                }
                v
            });
            let out = res.map_err(|e| Why(format!("tree {pid}: {}", stasis_image::one_line(&e))));
            r2.end(out.as_ref().err().cloned());
            out
        }));
    }
    threads
}

/// Sends the coordinator `said`, then waits for its `want` (see
/// [`coordinator_word`]).
fn say_then_hear(c: &mut Conn, said: &Msg, want: Msg) -> Result<(), Why> {
    c.send(said)
        .map_err(|e| Why(e.to_string()))
        .and_then(|()| coordinator_word(c, want))
}

/// Waits for the coordinator's `want`; anything else (an `Abort`, the end
/// of the connection) is why to abort.
fn coordinator_word(c: &mut Conn, want: Msg) -> Result<(), Why> {
    match c.recv() {
        Ok(Some(m)) if m == want => Ok(()),
        Ok(Some(Msg::Abort { why })) => Err(Why(format!("the coordinator aborted: {why}"))),
        Ok(Some(other)) => Err(Why(format!("unexpected {other:?} from the coordinator"))),
        Ok(None) => Err(Why("the coordinator went away".into())),
        Err(e) => Err(Why(format!("the coordinator is unreachable: {e}"))),
    }
}

/// Aborts a round: every tree thread is told, and joined (its tree put
/// back, or killed for a restore; its tentative checkpoint removed).
fn abort_round<T>(
    c: &mut Conn,
    round: &Round,
    threads: Vec<std::thread::JoinHandle<Result<T, Why>>>,
    why: Why,
) -> Result<(), ClusterError> {
    tracing::warn!("aborting a round for {}: {why}", c.peer);
    round.say(Some(Err(why.clone())), Some(Err(why.clone())));
    for t in threads {
        let _ = t.join();
    }
    // The coordinator may be gone: then this goes nowhere.
    let _ = c.send(&Msg::Failed { error: why.0 });
    let _ = c.send(&Msg::Aborted);
    Ok(())
}

/// The part of a cut one tree's restore plays.
struct RestorePart {
    round: Arc<Round>,
}

impl stasis_restore::RestoreCut for RestorePart {
    fn built(&self) -> Result<(), CutAbort> {
        self.round
            .barrier(|st| st.at_first += 1, |st| st.first.clone())
    }
}

/// A cluster restore on this host (see the protocol).
fn restore_round(c: &mut Conn, cfg: &AgentConfig, o: &RestoreOrder) -> Result<(), ClusterError> {
    let plan = jobs::check_job(&o.job).and_then(|()| restore_plan(cfg, o));
    let plan = match plan {
        Ok(p) => p,
        Err(e) => {
            return c.send(&Msg::Failed {
                error: e.to_string(),
            })
        }
    };
    let _ = c.stream().set_read_timeout(Some(ROUND_TIMEOUT));
    let round = Arc::new(Round::default());
    let n = plan.len();
    let mut threads = Vec::new();
    for (pid, checkpoint) in plan {
        let part = Arc::new(RestorePart {
            round: round.clone(),
        });
        let r2 = round.clone();
        let lazy = o.lazy.then(|| jobs::filler_log(&cfg.dir, &o.job, pid));
        let storage = cfg.storage.clone();
        let job = o.job.clone();
        threads.push(std::thread::spawn(move || {
            let res = storage
                .restore_source(&job, pid, checkpoint, lazy.is_some())
                .and_then(|src| restore_tree(src, part, lazy));
            let out = res.map_err(|e| Why(format!("tree {pid}: {}", stasis_image::one_line(&e))));
            r2.end(out.as_ref().err().cloned());
            out
        }));
    }
    let failed = round
        .wait_for(|s| s.at_first == n || s.failed.is_some())
        .failed
        .clone();
    if let Some(why) = failed {
        return abort_round(c, &round, threads, why);
    }
    let word = say_then_hear(c, &Msg::Built, Msg::Go);
    if let Err(why) = word {
        return abort_round(c, &round, threads, why);
    }
    round.say(Some(Ok(())), None);
    let mut pids = Vec::new();
    for t in threads {
        match t
            .join()
            .unwrap_or_else(|_| Err(Why("a restore thread panicked".into())))
        {
            Ok(r) => {
                crate::identity::learn(&o.job, r.pid);
                pids.push(r.pid);
                reap_later(r.init_pid.unwrap_or(r.pid));
            }
            Err(e) => {
                return c.send(&Msg::Failed {
                    error: format!("after every host was built: {e}"),
                })
            }
        }
    }
    c.send(&Msg::Running { pids })
}

/// Restores checkpoint `src.checkpoint` of `src.dir` as one part of a
/// cut; `lazy`: with a page filler of its own, which fills its memory in
/// while it runs and logs to the file given.
fn restore_tree(
    src: RestoreSource,
    part: Arc<RestorePart>,
    lazy: Option<PathBuf>,
) -> Result<stasis_restore::Restored, ClusterError> {
    let store = ImageDir::open(&src.dir)?;
    let n = src.checkpoint;
    let filler = if let Some(log) = lazy {
        let exe = stasis_kernel::launch::own_exe();
        let args = stasis_lazy::FillerArgs {
            dir: store.path().to_path_buf(),
            checkpoint: n,
            record_faults: src.record_faults,
            threads: 2,
            log: Some(Some(log)),
            extra: src.filler_args.clone(),
            ..Default::default()
        };
        Some(stasis_lazy::Filler::spawn(&exe, &args).map_err(|e| {
            ClusterError::Refused(format!("starting the page filler of a lazy restore: {e}"))
        })?)
    } else {
        None
    };
    let opts = stasis_restore::RestoreOptions {
        checkpoint: Some(n),
        cut: Some(part),
        lazy: filler
            .clone()
            .map(|f| Box::new(stasis_lazy::FillerSink(f)) as Box<dyn stasis_restore::LazySink>),
        ..Default::default()
    };
    let r = stasis_restore::restore(&store, &opts);
    // (A temporary copy goes now: a filler has read what it needs.)
    drop(src.keep);
    if let Some(f) = &filler {
        match &r {
            Ok(_) => {
                let _ = f.done();
            }
            Err(_) => f.abort(),
        }
        // Our child: reaped once it has filled everything in.
        reap_later(f.pid);
    }
    Ok(r?)
}

/// The (tree root, checkpoint) pairs of a restore: the checkpoint of the
/// round asked for, for each tree asked for (every tree of the job if none).
fn restore_plan(cfg: &AgentConfig, o: &RestoreOrder) -> Result<Vec<(i32, u32)>, ClusterError> {
    let trees = cfg.storage.rounds(&o.job)?;
    let wanted: Vec<i32> = if o.pids.is_empty() {
        trees.iter().map(|t| t.pid).collect()
    } else {
        o.pids.clone()
    };
    if wanted.is_empty() {
        return Err(ClusterError::Refused(format!(
            "this agent holds no tree of job {}",
            o.job
        )));
    }
    wanted
        .into_iter()
        .map(|pid| {
            trees
                .iter()
                .find(|t| t.pid == pid)
                .and_then(|t| t.rounds.iter().find(|(r, _)| *r == o.round))
                .map(|&(_, n)| (pid, n))
                .ok_or_else(|| {
                    ClusterError::Refused(format!(
                        "tree {pid} of job {} has no checkpoint of round {}",
                        o.job, o.round
                    ))
                })
        })
        .collect()
}

/// The restored root is our child: reaps it when it ends, so it leaves
/// no zombie behind. It waits for the end on a pidfd first, never in
/// `waitpid` while the process lives: a later dump by this agent traces
/// the root, and a `waitpid` of any thread of ours would take the ptrace
/// stops meant for the dumping thread (which would then wait for ever).
fn reap_later(pid: i32) {
    std::thread::spawn(move || {
        let Ok(pfd) = stasis_kernel::pidfd::pidfd_open(pid) else {
            return;
        };
        loop {
            let mut fds = [nix::poll::PollFd::new(
                std::os::fd::AsFd::as_fd(&pfd),
                nix::poll::PollFlags::POLLIN,
            )];
            match nix::poll::poll(&mut fds, nix::poll::PollTimeout::NONE) {
                Ok(n) if n > 0 => break,
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(_) => return,
            }
        }
        let p = nix::unistd::Pid::from_raw(pid);
        loop {
            match nix::sys::wait::waitpid(p, Some(nix::sys::wait::WaitPidFlag::__WALL)) {
                Err(nix::errno::Errno::EINTR) => {}
                Ok(s) => {
                    tracing::info!("restored tree {pid} ended: {s:?}");
                    break;
                }
                // Reaped by a tracer of ours already.
                Err(_) => break,
            }
        }
    });
}
