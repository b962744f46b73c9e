//! The supervisor of `stasis run`: runs a job, checkpoints it periodically
//! (a fixed interval, or Young's formula over the measured cost), records
//! a touch window after each checkpoint if asked, and when the job fails
//! restores the latest checkpoint (up to `--max-restarts` times). The job
//! may also ask for a checkpoint now ([`request`]): it is answered once the
//! checkpoint is committed, and again after a restore from it.
//!
//! The loop ([`supervise`]) makes every decision; what it acts on (the
//! process, the checkpoints, the printing) sits behind [`Host`], which the
//! `stasis` binary implements over `stasis-capture` and `stasis-restore`
//! and the tests below implement with a script. The decisions themselves
//! are in [`policy`].

pub mod parse;
pub mod policy;
pub mod request;

use std::time::{Duration, Instant};

use nix::sys::wait::WaitStatus;

pub use parse::{parse_duration, parse_size, ParseError};
pub use policy::{
    describe, exit_code, touch_window, young_interval, Every, Leave, OnExit, RestartPolicy,
    Schedule, Young,
};
pub use request::Answer;

/// An error of the host, with its causes.
pub type HostError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Errors that end `stasis run`.
#[derive(Debug, thiserror::Error)]
pub enum SuperviseError {
    /// Starting or waiting for the job failed.
    #[error(transparent)]
    Host(HostError),
    #[error(transparent)]
    TouchWindow(#[from] ParseError),
    #[error("restoring checkpoint {checkpoint} after the job failed")]
    Restore {
        checkpoint: u32,
        #[source]
        source: HostError,
    },
}

/// What [`Host::wait`] saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wake<Q> {
    /// The job ended.
    Exited(WaitStatus),
    /// The deadline passed.
    Due,
    /// The job asked for a checkpoint now (one or more requesters).
    Requested(Vec<Q>),
}

/// What a checkpoint gives the loop.
pub trait Dumped {
    fn checkpoint(&self) -> u32;
    /// What it cost, from freeze to commit.
    fn total_us(&self) -> u64;
}

/// The outcome of [`Host::checkpoint`].
#[derive(Debug)]
pub enum Checkpointed<D> {
    Done(D),
    /// The dump failed because the job had ended.
    JobExited(WaitStatus),
    /// The dump failed; the job runs on.
    Failed(HostError),
}

/// What the loop reports, for the host to print.
#[derive(Debug)]
pub enum Event<D, T, R> {
    Started {
        pid: i32,
    },
    Checkpoint {
        dump: D,
        /// The interval until the next one.
        interval: Duration,
        /// With `--every auto`: the cost and MTBF that gave `interval`.
        young: Option<Young>,
    },
    CheckpointFailed(HostError),
    TouchSet {
        checkpoint: u32,
        result: Result<T, HostError>,
    },
    /// The job ended and `stasis run` leaves with `code`.
    Exited {
        pid: i32,
        status: WaitStatus,
        code: u8,
        why: Leave,
    },
    /// The job failed and checkpoint `checkpoint` runs again as `pid`.
    Restored {
        failed_pid: i32,
        status: WaitStatus,
        code: u8,
        checkpoint: u32,
        pid: i32,
        restored: R,
        restart: u32,
    },
}

/// What the supervisor acts on.
pub trait Host {
    type Dump: Dumped;
    type Touch;
    type Restored;
    /// Who asked for a checkpoint (to answer to).
    type Request;
    /// Starts the job; returns its pid.
    fn start(&mut self) -> Result<i32, HostError>;
    /// Waits until `deadline`, until job `pid` ends or until it asks for a
    /// checkpoint, whichever is first.
    fn wait(&mut self, pid: i32, deadline: Instant) -> Result<Wake<Self::Request>, HostError>;
    /// Tells a requester what became of its checkpoint.
    fn answer(&mut self, to: &Self::Request, answer: &Answer);
    /// Checkpoints job `pid` (which keeps running).
    fn checkpoint(&mut self, pid: i32) -> Checkpointed<Self::Dump>;
    /// Bytes a restore of `checkpoint` brings back.
    fn restored_bytes(&mut self, checkpoint: u32) -> Result<u64, HostError>;
    /// Stores what the job wrote since `checkpoint` (`window` ago) as its
    /// touch set.
    fn record_touch(&mut self, checkpoint: u32, window: Duration)
        -> Result<Self::Touch, HostError>;
    /// Reaps what the ended job left behind (without waiting).
    fn reap_orphans(&mut self);
    /// The newest checkpoint.
    fn latest(&mut self) -> Option<u32>;
    /// Restores `checkpoint`; returns the new job's pid.
    fn restore(&mut self, checkpoint: u32) -> Result<(i32, Self::Restored), HostError>;
    /// After a restore: dirty tracking starts over (a full checkpoint).
    fn reset_tracking(&mut self);
    fn report(&mut self, event: Event<Self::Dump, Self::Touch, Self::Restored>);
}

/// What `stasis run` was asked for.
#[derive(Debug, Clone)]
pub struct Config {
    pub every: Every,
    pub restart: RestartPolicy,
    /// `--touch-window`: seconds or `auto`.
    pub touch_window: Option<String>,
}

struct Supervisor<'h, H: Host> {
    host: &'h mut H,
    config: Config,
    schedule: Schedule,
    pid: i32,
    restarts: u32,
    /// The latest checkpoint taken at the job's request, and who asked:
    /// they are told `restored` whenever it is restored.
    asked: Option<(u32, Vec<H::Request>)>,
}

/// Runs the job under `config` until it ends for good; returns the exit
/// code to leave with (the job's, 128 + signal when it was killed).
pub fn supervise<H: Host>(host: &mut H, config: Config) -> Result<u8, SuperviseError> {
    let pid = host.start().map_err(SuperviseError::Host)?;
    host.report(Event::Started { pid });
    let schedule = Schedule::new(config.every);
    let mut s = Supervisor {
        host,
        config,
        schedule,
        pid,
        restarts: 0,
        asked: None,
    };
    s.run()
}

impl<H: Host> Supervisor<'_, H> {
    fn run(&mut self) -> Result<u8, SuperviseError> {
        let mut next = Instant::now() + self.schedule.interval();
        // (checkpoint, when its touch window ends, window)
        let mut touch_due: Option<(u32, Instant, Duration)> = None;
        loop {
            let wake = touch_due.map_or(next, |(_, t, _)| t.min(next));
            match self
                .host
                .wait(self.pid, wake)
                .map_err(SuperviseError::Host)?
            {
                Wake::Due if touch_due.is_some_and(|(_, t, _)| Instant::now() >= t) => {
                    if let Some((n, _, w)) = touch_due.take() {
                        let result = self.host.record_touch(n, w);
                        self.host.report(Event::TouchSet {
                            checkpoint: n,
                            result,
                        });
                    }
                }
                Wake::Due => {
                    if let Some(code) = self.round(Vec::new(), &mut next, &mut touch_due)? {
                        return Ok(code);
                    }
                }
                Wake::Requested(asked) => {
                    if let Some(code) = self.round(asked, &mut next, &mut touch_due)? {
                        return Ok(code);
                    }
                }
                Wake::Exited(status) => {
                    if let Some(code) = self.ended(status)? {
                        return Ok(code);
                    }
                    next = Instant::now() + self.schedule.interval();
                }
            }
        }
    }

    /// One checkpoint, periodic or asked for by `asked`: they are answered
    /// once it is committed (or failed). Returns the exit code to leave
    /// with if the job ended for good meanwhile.
    fn round(
        &mut self,
        asked: Vec<H::Request>,
        next: &mut Instant,
        touch_due: &mut Option<(u32, Instant, Duration)>,
    ) -> Result<Option<u8>, SuperviseError> {
        match self.host.checkpoint(self.pid) {
            Checkpointed::Done(d) => {
                let n = d.checkpoint();
                for r in &asked {
                    self.host.answer(r, &Answer::Committed(n));
                }
                if !asked.is_empty() {
                    self.asked = Some((n, asked));
                }
                if let Some(t) = self.checkpointed(d)? {
                    *touch_due = Some(t);
                }
                *next = Instant::now() + self.schedule.interval();
            }
            Checkpointed::JobExited(status) => {
                // Whoever asked is gone with the job.
                if let Some(code) = self.ended(status)? {
                    return Ok(Some(code));
                }
                // Restored: checkpoint it right away.
                *next = Instant::now();
            }
            Checkpointed::Failed(e) => {
                let why = e.to_string();
                for r in &asked {
                    self.host.answer(r, &Answer::Failed(why.clone()));
                }
                self.host.report(Event::CheckpointFailed(e));
                *next = Instant::now() + self.schedule.interval();
            }
        }
        Ok(None)
    }

    /// Accounts and reports a checkpoint; returns its touch window, if
    /// one is to be recorded.
    fn checkpointed(
        &mut self,
        d: H::Dump,
    ) -> Result<Option<(u32, Instant, Duration)>, SuperviseError> {
        let (n, total_us) = (d.checkpoint(), d.total_us());
        let young = self.schedule.checkpointed(total_us);
        let interval = self.schedule.interval();
        self.host.report(Event::Checkpoint {
            dump: d,
            interval,
            young,
        });
        let Some(spec) = &self.config.touch_window else {
            return Ok(None);
        };
        let bytes = self.host.restored_bytes(n).map_err(SuperviseError::Host)?;
        let w = touch_window(spec, bytes, total_us, Some(interval.as_secs_f64()))?;
        Ok(w.map(|w| (n, Instant::now() + w, w)))
    }

    /// The job ended: returns the exit code to leave with, or `None` after
    /// a restart from the latest checkpoint (`self.pid` is then the
    /// restored job).
    fn ended(&mut self, status: WaitStatus) -> Result<Option<u8>, SuperviseError> {
        let (code, failed) = exit_code(&status);
        self.host.reap_orphans();
        let latest = self.host.latest();
        let pid = self.pid;
        let checkpoint = match self.config.restart.decide(failed, latest, self.restarts) {
            OnExit::Leave(why) => {
                self.host.report(Event::Exited {
                    pid,
                    status,
                    code,
                    why,
                });
                return Ok(Some(code));
            }
            OnExit::Restart(cp) => cp,
        };
        self.restarts += 1;
        let (new_pid, restored) = self
            .host
            .restore(checkpoint)
            .map_err(|source| SuperviseError::Restore { checkpoint, source })?;
        self.pid = new_pid;
        self.host.report(Event::Restored {
            failed_pid: pid,
            status,
            code,
            checkpoint,
            pid: new_pid,
            restored,
            restart: self.restarts,
        });
        self.host.reset_tracking();
        // The job is back inside the request that took this checkpoint.
        if let Some((n, asked)) = &self.asked {
            if *n == checkpoint {
                for r in asked {
                    self.host.answer(r, &Answer::Restored(*n));
                }
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests;
